// Issue 41: what a user sees. Kernels named by their notebooks (item 1), a
// two-GPU kernel's chart and words (item 2), "over the cap" in the status
// bar's tooltip and the charts' scale, time axis and readout (item 6), and
// the whole GPU (item 7).
import {
  clockSeconds,
  memoryLabel,
  memoryReadout,
  readingAt,
  smReadout,
  splitText,
  timeTicks,
  wholeLabel,
  wholeReadout
} from '../src/chart';
import {
  GIB,
  MIB,
  kernelMemoryView,
  kernelName,
  kernelTitle,
  overCapLines,
  parkErrorText,
  parkResultText,
  parseKernelStatus,
  tooltipText,
  wholeGpuHolders,
  wholeGpuText,
  wholeGpuTitle
} from '../src/format';
import { ISample, IWholeSample, SliceHistory } from '../src/history';
import { IGpuStatus, IKernelSliceStatus, ISliceKernel, IWholeGpu } from '../src/types';

const T0 = 1_700_000_000_000;
const FRAME = { now: T0 + 300_000, windowMs: 300_000 };
const ID = '94396956-1c34-4cfc-8500-be1623cd8463';

function gpu(index: number, used: number, limit: number): IGpuStatus {
  return { index, uuid: `GPU-${index}`, memory_total: 16 * GIB, memory_used: used, memory_limit: limit, sm_share: 25, sm_util: 0 };
}

function status(gpus: IGpuStatus[], kernels: ISliceKernel[], extra: Partial<IKernelSliceStatus> = {}): IKernelSliceStatus {
  return {
    kernel_id: ID,
    in_slice: true,
    slice: 'two-gpus',
    path: '/run/hami/two-gpus.slice',
    sm_share: 25,
    sm_util: 0,
    gpus,
    kernels,
    warning_fraction: 0.8,
    critical_fraction: 0.95,
    ...extra
  };
}

/** The 2.6 GiB kernel of the issue: 0.8 GiB on GPU 0, 1.8 GiB on GPU 1, 2.0 GiB caps. */
function twoGpuKernel(): { status: IKernelSliceStatus; kernel: ISliceKernel } {
  const kernel: ISliceKernel = {
    kernel_id: ID,
    notebook: 'train/two.ipynb',
    memory_used: 2.6 * GIB,
    sm_util: 0,
    this_server: true,
    processes: [{ pid: 7, memory_used: { 'GPU-0': 0.8 * GIB, 'GPU-1': 1.8 * GIB } }]
  };
  return { status: status([gpu(0, 0.8 * GIB, 2 * GIB), gpu(1, 1.8 * GIB, 2 * GIB)], [kernel]), kernel };
}

describe('kernels named by their notebooks', () => {
  it('names a kernel by its notebook, the whole id in its tooltip', () => {
    const k = { kernel_id: ID, notebook: 'work/analysis.ipynb' };
    expect(kernelName(k)).toBe('work/analysis.ipynb');
    expect(kernelTitle(k)).toBe(`kernel ${ID}: work/analysis.ipynb`);
  });

  it('by its short id where the server knows no notebook', () => {
    expect(kernelName({ kernel_id: ID })).toBe('94396956');
    expect(kernelName({ kernel_id: ID, notebook: '  ' })).toBe('94396956');
    expect(kernelTitle({ kernel_id: ID, notebook: null })).toBe(`kernel ${ID}`);
  });

  it('says the notebook in the notices of a park or resume', () => {
    expect(parkResultText({ kernel_id: ID, park_state: 'parked', parked_bytes: GIB, seconds: 1 }, 'a.ipynb')).toBe(
      'Parked a.ipynb: 1.0 GiB moved to host memory in 1.0 s'
    );
    expect(parkErrorText('resume', ID, 'no room', 'a.ipynb')).toBe('Cannot resume a.ipynb: no room');
  });
});

describe('a kernel on two GPUs', () => {
  it('is charted as its sum against the sum of its GPUs\' caps: never over when no GPU is', () => {
    const { status: s, kernel } = twoGpuKernel();
    const history = new SliceHistory({ windowMs: 300_000, minIntervalMs: 500 });
    history.record(s, T0 + 299_000);
    const samples = history.kernel(ID);
    const label = memoryLabel('Kernel train/two.ipynb', samples, FRAME);
    expect(label).toContain('2.6 GiB in use on GPU 0 and GPU 1, of their 4.0 GiB of caps (65 %)');
    expect(label).toContain('GPU 0 819 MiB of its 2.0 GiB cap (40 %), GPU 1 1.8 GiB of its 2.0 GiB cap (90 %)');
    expect(label).not.toMatch(/1[0-9]{2} %|cap \(13/);
    // The row's tooltip says each GPU against its own cap, the same figures.
    expect(kernelMemoryView(kernel, s)).toEqual({
      level: 'warning',
      title: "GPU 0: 819 MiB, 40 % of its cap · GPU 1: 1.8 GiB, 90 % of its cap"
    });
  });

  it('says the sum against the sum, then each GPU against its own', () => {
    expect(
      splitText(3 * GIB, 4 * GIB, [
        { gpu: 0, used: GIB, cap: 2 * GIB },
        { gpu: 1, used: 2 * GIB, cap: 2 * GIB }
      ])
    ).toBe('3.0 GiB in use on GPU 0 and GPU 1, of their 4.0 GiB of caps (75 %): GPU 0 1.0 GiB of its 2.0 GiB cap (50 %), GPU 1 2.0 GiB of its 2.0 GiB cap (100 %)');
  });
});

describe('the status bar tooltip', () => {
  it('says "over the cap" for a GPU over its cap', () => {
    const s = status([gpu(0, 864 * MIB, 512 * MIB)], []);
    expect(overCapLines(s)).toEqual([
      'Over the cap on GPU 0: 864 MiB in use of the 512 MiB cap; new allocations are refused until use falls below it'
    ]);
    expect(tooltipText(s)).toContain('Over the cap on GPU 0');
  });

  it('never says it when no GPU is over: at the cap, below it, or 2.6 GiB over two 2.0 GiB caps', () => {
    expect(overCapLines(status([gpu(0, GIB, GIB)], []))).toEqual([]);
    expect(tooltipText(twoGpuKernel().status)).not.toMatch(/over/i);
  });
});

describe('the charts: time axis and the reading under the pointer', () => {
  const sample = (s: number, used: number, extra: Partial<ISample> = {}): ISample => ({
    t: T0 + s * 1000, gap: false, used, sm: 20, cap: GIB, share: 25, real: null, parked: 0, state: 'running', ...extra
  });

  it('ticks the time axis at both ends', () => {
    expect(timeTicks(300_000).map(t => t.text)).toEqual(['\u22125 min', 'now']);
    expect(timeTicks(3_600_000).map(t => [t.at, t.text])).toEqual([[0, '\u22121 h'], [1, 'now']]);
  });

  it('reads the nearest reading to the pointer, none across a gap', () => {
    const samples = [sample(10, MIB), { ...sample(12, 0), gap: true, used: null }, sample(20, 2 * MIB)];
    expect(readingAt(samples, T0 + 11_000, 5_000)?.used).toBe(MIB);
    expect(readingAt(samples, T0 + 19_000, 5_000)?.used).toBe(2 * MIB);
    expect(readingAt(samples, T0 + 60_000, 5_000)).toBeNull();
    expect(readingAt([], T0, 5_000)).toBeNull();
  });

  it('says the reading with its time', () => {
    const at = clockSeconds(T0 + 10_000);
    expect(at).toMatch(/^\d\d:\d\d:\d\d$/);
    expect(memoryReadout(sample(10, 864 * MIB))).toBe(`${at} · 864 MiB of the 1.0 GiB cap`);
    expect(memoryReadout(sample(10, 0, { state: 'parked', parked: 800 * MIB }))).toBe(
      `${at} · parked, 800 MiB in host memory`
    );
    expect(smReadout(sample(10, 0))).toBe(`${at} · SM 20 % of a 25 % share`);
  });
});

describe('the whole GPU', () => {
  const whole: IWholeGpu = {
    index: 0,
    uuid: 'GPU-0',
    name: 'NVIDIA H200',
    memory_total: 140 * GIB,
    memory_used: 40.1 * GIB,
    utilization: 45,
    power_w: 312.4,
    power_limit_w: 700,
    temperature_c: 61,
    slice_used: 3.5 * GIB,
    slices: [{ slice: 'bob', memory_used: 1.2 * GIB }],
    others_used: 35.4 * GIB
  };

  it('is one line of NVML\'s figures, and who holds its memory', () => {
    expect(wholeGpuText(whole)).toBe(
      'Whole GPU 0 · 45 % busy · 40.1 / 140.0 GiB · 312 / 700 W · 61 °C'
    );
    expect(wholeGpuTitle(whole)).toBe('GPU 0, NVIDIA H200 (GPU-0): as NVML sees it, every process on it');
    expect(wholeGpuHolders(whole)).toBe('this slice 3.5 GiB · bob 1.2 GiB · others 35.4 GiB');
  });

  it('leaves out what NVML does not say', () => {
    const bare = { index: 1, uuid: 'GPU-1', memory_used: null, utilization: null, power_w: null, temperature_c: null };
    expect(wholeGpuText(bare)).toBe('Whole GPU 1 · no figures from NVML');
    expect(wholeGpuHolders({ ...bare, slice_used: GIB, others_used: null })).toBe('this slice 1.0 GiB');
  });

  it('is read from the answer, entries that are not GPUs dropped', () => {
    const parsed = parseKernelStatus({ kernel_id: 'k', in_slice: true, whole_gpus: [whole, 3, { index: 'x' }] });
    expect(parsed?.whole_gpus).toEqual([whole]);
    expect(parseKernelStatus({ kernel_id: 'k', in_slice: true, whole_gpus: 'no' })?.whole_gpus).toEqual([]);
  });

  it('charts utilization, memory, power and temperature, each in words', () => {
    const s: IWholeSample = { t: T0 + 299_000, gap: false, util: 45, used: 40 * GIB, total: 140 * GIB, slice: 3.5 * GIB, power: 312, power_limit: 700, temp: 61 };
    expect(wholeLabel('GPU 0', 'power', [s], FRAME)).toBe('GPU 0 as a whole, power, last 5 min: 312 W of its 700 W limit; highest 312 W');
    expect(wholeLabel('GPU 0', 'memory', [s], FRAME)).toBe(
      'GPU 0 as a whole, memory, last 5 min: 40.0 GiB in use of 140.0 GiB, this slice 3.5 GiB; highest 40.0 GiB'
    );
    expect(wholeLabel('GPU 0', 'util', [s], FRAME)).toBe('GPU 0 as a whole, utilization, last 5 min: 45 % busy; highest 45 %');
    expect(wholeLabel('GPU 0', 'temp', [], FRAME)).toBe('GPU 0 as a whole, temperature, last 5 min: no readings from NVML yet');
    expect(wholeReadout('temp', s)).toBe(`${clockSeconds(s.t)} · 61 °C`);
  });
});

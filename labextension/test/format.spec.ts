import {
  DEFAULT_REFRESH_RATE,
  DEFAULT_THRESHOLDS,
  GIB,
  KIB,
  MIB,
  asLevel,
  clockText,
  formatBytes,
  formatGiB,
  formatMemory,
  formatPercent,
  formatSM,
  fullestGpu,
  gpuGuardOver,
  gpuLevel,
  gpuReal,
  gpuText,
  GUARD_OVER_CLASS,
  guardOverLines,
  guardOverText,
  guardParkedLines,
  guardParkedText,
  guaranteeText,
  heldLines,
  heldText,
  kernelGpu,
  kernelMemoryView,
  kernelNoteText,
  kernelParkText,
  levelClass,
  memoryFraction,
  memoryHeadline,
  memoryLevel,
  normalizeRefreshRate,
  panelHeadline,
  PARKED_CLASS,
  PARKING_TEXT,
  parkAction,
  parkErrorText,
  parkInfo,
  parkReasonText,
  parkResultText,
  parkStatusText,
  parseKernelStatus,
  REAL_SLACK_BYTES,
  realDiffers,
  realText,
  RESUMING_CLASS,
  RESUMING_TEXT,
  resumeResultText,
  roomWaitText,
  scaleText,
  shortId,
  sliceLevel,
  sliceText,
  sortKernels,
  statusGuardClass,
  statusParkClass,
  statusText,
  statusThresholds,
  tooltipText,
  UNREADABLE_TEXT,
  worseLevel
} from '../src/format';
import { IGpuStatus, IKernelSliceStatus, ISliceKernel } from '../src/types';

function gpu(overrides: Partial<IGpuStatus> = {}): IGpuStatus {
  return {
    index: 0,
    uuid: 'GPU-0',
    memory_total: 80 * GIB,
    memory_used: 0,
    memory_limit: 0,
    memory_level: 'ok',
    sm_share: 0,
    sm_util: 0,
    ...overrides
  };
}

function kernel(id: string, memory: number, sm = 0, thisServer = true): ISliceKernel {
  return { kernel_id: id, memory_used: memory, sm_util: sm, this_server: thisServer };
}

/** A kernel in a slice of 4 GiB and 25 % SM using 1.2 GiB and 23 %, as the server answers. */
function inSlice(overrides: Partial<IKernelSliceStatus> = {}): IKernelSliceStatus {
  return {
    kernel_id: 'k1',
    in_slice: true,
    slice: 'alice',
    path: '/run/hami/slices/alice.slice',
    memory_used: 1.2 * GIB,
    memory_limit: 4 * GIB,
    memory_level: 'ok',
    sm_share: 25,
    sm_util: 23,
    kernel: { memory_used: 0.8 * GIB, sm_util: 10, processes: [] },
    gpus: [gpu({ memory_used: 1.2 * GIB, memory_limit: 4 * GIB, sm_share: 25, sm_util: 23 })],
    kernels: [kernel('k1', 0.8 * GIB, 10), kernel('k2', 0.4 * GIB, 13)],
    warning_fraction: 0.8,
    critical_fraction: 0.95,
    ...overrides
  };
}

describe('byte formatting', () => {
  it('shows GiB with one decimal', () => {
    expect(formatGiB(1.2 * GIB)).toBe('1.2');
    expect(formatGiB(4 * GIB)).toBe('4.0');
    expect(formatGiB(0)).toBe('0.0');
    expect(formatGiB(0.04 * GIB)).toBe('0.0');
    expect(formatGiB(79.96 * GIB)).toBe('80.0');
  });

  it('treats nonsense as zero', () => {
    expect(formatGiB(-5)).toBe('0.0');
    expect(formatGiB(NaN)).toBe('0.0');
    expect(formatGiB(Infinity)).toBe('0.0');
  });

  it('writes used / limit, or used alone without a cap', () => {
    expect(formatMemory(1.2 * GIB, 4 * GIB)).toBe('1.2 / 4.0 GiB');
    expect(formatMemory(1.2 * GIB, 0)).toBe('1.2 GiB');
    expect(formatMemory(0, 512 * MIB)).toBe('0.0 / 0.5 GiB');
  });

  it('picks the largest unit reached for the panel', () => {
    expect(formatBytes(0)).toBe('0 B');
    expect(formatBytes(512)).toBe('512 B');
    expect(formatBytes(12 * KIB)).toBe('12 KiB');
    expect(formatBytes(300 * MIB)).toBe('300 MiB');
    expect(formatBytes(1.2 * GIB)).toBe('1.2 GiB');
    expect(formatBytes(1023.7 * MIB)).toBe('1.0 GiB');
    expect(formatBytes(1023.7 * KIB)).toBe('1 MiB');
  });

  it('shortens kernel ids', () => {
    expect(shortId('0123456789abcdef')).toBe('01234567');
    expect(shortId('abc')).toBe('abc');
  });
});

describe('percent and SM formatting', () => {
  it('rounds percentages', () => {
    expect(formatPercent(23)).toBe('23 %');
    expect(formatPercent(23.5)).toBe('24 %');
    expect(formatPercent(-1)).toBe('0 %');
  });

  it('writes util / share, or util alone without an SM limit', () => {
    expect(formatSM(23, 25)).toBe('SM 23 % / 25 %');
    expect(formatSM(23, 0)).toBe('SM 23 %');
  });
});

describe('status text', () => {
  it('is the issue example for a capped slice', () => {
    expect(statusText(inSlice())).toBe('vGPU 1.2 / 4.0 GiB · SM 23 % / 25 %');
  });

  /** The slice without a memory cap: neither the slice nor its GPU has one. */
  const uncapped = (overrides: Partial<IKernelSliceStatus> = {}): IKernelSliceStatus =>
    inSlice({
      memory_limit: 0,
      gpus: [gpu({ memory_used: 1.2 * GIB, memory_limit: 0, sm_share: 25, sm_util: 23 })],
      ...overrides
    });

  it('drops the cap without a memory limit', () => {
    expect(statusText(uncapped())).toBe('vGPU 1.2 GiB · SM 23 % / 25 %');
  });

  it('drops the share without an SM limit', () => {
    expect(statusText(inSlice({ sm_share: 0 }))).toBe('vGPU 1.2 / 4.0 GiB · SM 23 %');
  });

  it('has neither without any limit', () => {
    expect(statusText(uncapped({ sm_share: 0 }))).toBe('vGPU 1.2 GiB · SM 23 %');
  });

  it('says the cap of the slice before it used any GPU', () => {
    expect(statusText(inSlice({ memory_used: 0, gpus: [] }))).toBe('vGPU 0.0 / 4.0 GiB · SM 23 % / 25 %');
  });

  it('is null (item hidden) outside a slice and before any answer', () => {
    expect(statusText({ kernel_id: 'k', in_slice: false, reason: 'not HAMi' })).toBeNull();
    expect(statusText(null)).toBeNull();
  });

  it('says the slice is unreadable when the server reports an error', () => {
    const status: IKernelSliceStatus = {
      kernel_id: 'k',
      in_slice: true,
      slice: 'alice',
      path: '/x',
      error: 'the slice file is gone'
    };
    expect(statusText(status)).toBe(UNREADABLE_TEXT);
  });
});

describe('the fullest GPU in the headline', () => {
  /**
   * The slice: two GPUs with a 4 GiB cap each, 3.5 GiB on GPU 0, as
   * an older server sent it (top level summed: 3.5 of 8 GiB, 44 %).
   */
  const twoGpus = (overrides: Partial<IKernelSliceStatus> = {}): IKernelSliceStatus =>
    inSlice({
      memory_used: 3.5 * GIB,
      memory_limit: 8 * GIB,
      gpus: [
        gpu({ index: 0, uuid: 'GPU-0', memory_used: 3.5 * GIB, memory_limit: 4 * GIB, sm_share: 25, sm_util: 23 }),
        gpu({ index: 1, uuid: 'GPU-1', memory_used: 0, memory_limit: 4 * GIB, sm_share: 25 })
      ],
      ...overrides
    });

  it('shows the fullest GPU, named, never the sum of the caps', () => {
    expect(statusText(twoGpus())).toBe('vGPU 3.5 / 4.0 GiB (GPU 0) · SM 23 % / 25 %');
    expect(sliceText(twoGpus())).toBe('vGPU 3.5 / 4.0 GiB (GPU 0) · SM 23 % / 25 %');
    // The same from a server that sends the fullest GPU's figures at the top.
    const fixed = twoGpus({ memory_limit: 4 * GIB, memory_gpu: 0 });
    expect(statusText(fixed)).toBe('vGPU 3.5 / 4.0 GiB (GPU 0) · SM 23 % / 25 %');
    expect(memoryHeadline(twoGpus())).toEqual({ used: 3.5 * GIB, limit: 4 * GIB, gpu: 0, gpuCount: 2 });
    // The meter: 88 % of GPU 0's cap, not 44 % of 8 GiB.
    const headline = memoryHeadline(twoGpus())!;
    expect(memoryFraction(headline.used, headline.limit)).toBeCloseTo(0.875);
  });

  it('colours by the fullest GPU', () => {
    expect(sliceLevel(twoGpus())).toBe('warning'); // 88 % of 4 GiB; the summed 44 % would be ok
    expect(sliceLevel(twoGpus({ gpus: [gpu({ index: 0, memory_used: 3.9 * GIB, memory_limit: 4 * GIB }), gpu({ index: 1, memory_limit: 4 * GIB })] }))).toBe('critical');
  });

  it('takes the GPU nearest its cap, not the one with the most bytes', () => {
    const gpus = [
      gpu({ index: 0, memory_used: 6 * GIB, memory_limit: 16 * GIB }), // 38 %
      gpu({ index: 1, memory_used: 3 * GIB, memory_limit: 4 * GIB }) // 75 %
    ];
    expect(fullestGpu(gpus)?.index).toBe(1);
    expect(statusText(inSlice({ memory_used: 9 * GIB, memory_limit: 20 * GIB, sm_share: 0, gpus }))).toBe(
      'vGPU 3.0 / 4.0 GiB (GPU 1) · SM 23 %'
    );
  });

  it('prefers a capped GPU to an uncapped one, and the first of equals', () => {
    const capped = gpu({ index: 1, memory_used: 0, memory_limit: 4 * GIB });
    expect(fullestGpu([gpu({ index: 0, memory_used: 10 * GIB, memory_limit: 0 }), capped])).toBe(capped);
    const a = gpu({ index: 0, memory_limit: 4 * GIB });
    expect(fullestGpu([a, gpu({ index: 1, memory_limit: 4 * GIB })])).toBe(a);
    // Without any cap: the GPU with the most bytes in use, no cap shown.
    const busy = gpu({ index: 1, memory_used: 2 * GIB });
    expect(fullestGpu([gpu({ index: 0, memory_used: GIB }), busy])).toBe(busy);
    expect(fullestGpu([])).toBeNull();
    expect(fullestGpu(undefined)).toBeNull();
  });

  it('names no GPU for a slice on one GPU', () => {
    expect(memoryHeadline(inSlice())).toEqual({ used: 1.2 * GIB, limit: 4 * GIB, gpu: 0, gpuCount: 1 });
    expect(statusText(inSlice())).not.toContain('(GPU');
  });

  it('has no headline outside a slice or for an unreadable slice file', () => {
    expect(memoryHeadline(null)).toBeNull();
    expect(memoryHeadline({ kernel_id: 'k', in_slice: false })).toBeNull();
    expect(memoryHeadline({ kernel_id: 'k', in_slice: true, error: 'gone' })).toBeNull();
  });
});

describe('memory levels', () => {
  const limit = 100 * MIB;

  it('turns to warning at 80 % and critical at 95 % (inclusive)', () => {
    expect(memoryLevel(0, limit)).toBe('ok');
    expect(memoryLevel(79.9 * MIB, limit)).toBe('ok');
    expect(memoryLevel(80 * MIB, limit)).toBe('warning');
    expect(memoryLevel(94.9 * MIB, limit)).toBe('warning');
    expect(memoryLevel(95 * MIB, limit)).toBe('critical');
    expect(memoryLevel(120 * MIB, limit)).toBe('critical');
  });

  it('is always ok without a cap', () => {
    expect(memoryLevel(80 * GIB, 0)).toBe('ok');
    expect(memoryFraction(1, 0)).toBeNull();
    expect(memoryFraction(25, 100)).toBe(0.25);
  });

  it('follows the given thresholds', () => {
    const thresholds = { warning: 0.5, critical: 0.7 };
    expect(memoryLevel(49 * MIB, limit, thresholds)).toBe('ok');
    expect(memoryLevel(50 * MIB, limit, thresholds)).toBe('warning');
    expect(memoryLevel(70 * MIB, limit, thresholds)).toBe('critical');
  });

  it('orders levels', () => {
    expect(worseLevel('ok', 'warning')).toBe('warning');
    expect(worseLevel('critical', 'warning')).toBe('critical');
    expect(worseLevel('ok', 'ok')).toBe('ok');
    expect(levelClass('warning')).toBe('hami-level-warning');
    expect(asLevel('critical')).toBe('critical');
    expect(asLevel('bad')).toBeNull();
    expect(asLevel(3)).toBeNull();
  });
});

describe('thresholds from the server', () => {
  it('takes the fractions the server sends', () => {
    expect(statusThresholds(inSlice({ warning_fraction: 0.5, critical_fraction: 0.7 }))).toEqual({
      warning: 0.5,
      critical: 0.7
    });
    expect(statusThresholds(inSlice({ warning_fraction: 0, critical_fraction: 1 }))).toEqual({
      warning: 0,
      critical: 1
    });
    // Equal thresholds are a valid pair: no warning step, straight to critical.
    expect(statusThresholds(inSlice({ warning_fraction: 0.9, critical_fraction: 0.9 }))).toEqual({
      warning: 0.9,
      critical: 0.9
    });
  });

  it('makes a slice at 60 % a warning and at 70 % critical with 0.5 and 0.7', () => {
    const fractions = { warning_fraction: 0.5, critical_fraction: 0.7 };
    const at = (used: number): IKernelSliceStatus =>
      inSlice({
        ...fractions,
        memory_used: used,
        memory_limit: 10 * GIB,
        gpus: [gpu({ memory_used: used, memory_limit: 10 * GIB })]
      });
    expect(sliceLevel(at(4.9 * GIB))).toBe('ok');
    expect(sliceLevel(at(6 * GIB))).toBe('warning');
    expect(sliceLevel(at(6.9 * GIB))).toBe('warning');
    expect(sliceLevel(at(7 * GIB))).toBe('critical');
    // The same 60 % and 70 % measured with 0.8 / 0.95: ok.
    expect(sliceLevel({ ...at(6 * GIB), warning_fraction: 0.8, critical_fraction: 0.95 })).toBe('ok');
    expect(sliceLevel({ ...at(7 * GIB), warning_fraction: 0.8, critical_fraction: 0.95 })).toBe('ok');
    const thresholds = statusThresholds(at(0));
    expect(gpuLevel(gpu({ memory_used: 6 * GIB, memory_limit: 10 * GIB }), thresholds)).toBe('warning');
    expect(gpuLevel(gpu({ memory_used: 7 * GIB, memory_limit: 10 * GIB }), thresholds)).toBe('critical');
  });

  it('falls back to 0.8 / 0.95 without fractions (an older server)', () => {
    const status = inSlice({ warning_fraction: undefined, critical_fraction: undefined });
    expect(statusThresholds(status)).toEqual({ warning: 0.8, critical: 0.95 });
    expect(sliceLevel({ ...status, memory_used: 3.3 * GIB, gpus: [] })).toBe('warning'); // 82 %
    expect(sliceLevel({ ...status, memory_used: 3 * GIB, gpus: [] })).toBe('ok'); // 75 %
  });

  it.each([
    ['strings', { warning_fraction: '0.5', critical_fraction: '0.7' }],
    ['a string warning', { warning_fraction: '0.5', critical_fraction: 0.7 }],
    ['null', { warning_fraction: null, critical_fraction: null }],
    ['a missing critical', { warning_fraction: 0.5, critical_fraction: undefined }],
    ['a missing warning', { warning_fraction: undefined, critical_fraction: 0.7 }],
    ['a negative warning', { warning_fraction: -0.5, critical_fraction: 0.7 }],
    ['a critical above 1', { warning_fraction: 0.5, critical_fraction: 1.5 }],
    ['percentages', { warning_fraction: 50, critical_fraction: 70 }],
    ['NaN', { warning_fraction: NaN, critical_fraction: 0.7 }],
    ['Infinity', { warning_fraction: 0.5, critical_fraction: Infinity }],
    ['warning above critical', { warning_fraction: 0.7, critical_fraction: 0.5 }]
  ])('falls back to the defaults for %s', (_name, fractions) => {
    const status = { ...inSlice(), ...fractions } as unknown as IKernelSliceStatus;
    expect(statusThresholds(status)).toEqual(DEFAULT_THRESHOLDS);
    // A slice at 60 % is then ok, not the warning (or critical) 0.5 / 0.7 would give.
    expect(sliceLevel({ ...status, memory_used: 2.4 * GIB, gpus: [] })).toBe('ok');
  });

  it('uses the defaults outside a slice, for an unreadable slice and before any answer', () => {
    expect(statusThresholds(null)).toEqual(DEFAULT_THRESHOLDS);
    expect(
      statusThresholds({ kernel_id: 'k', in_slice: false, warning_fraction: 0.5, critical_fraction: 0.7 })
    ).toEqual(DEFAULT_THRESHOLDS);
    expect(
      statusThresholds({
        kernel_id: 'k',
        in_slice: true,
        error: 'gone',
        warning_fraction: 0.5,
        critical_fraction: 0.7
      })
    ).toEqual(DEFAULT_THRESHOLDS);
  });

  it('never hands out the shared defaults object', () => {
    const thresholds = statusThresholds(null);
    thresholds.warning = 0.1;
    expect(DEFAULT_THRESHOLDS.warning).toBe(0.8);
    expect(statusThresholds(null).warning).toBe(0.8);
  });
});

describe('refresh rate from the settings', () => {
  it('keeps the refresh rate at 500 ms or more', () => {
    expect(normalizeRefreshRate(2000)).toBe(2000);
    expect(normalizeRefreshRate(100)).toBe(500);
    expect(normalizeRefreshRate(1234.4)).toBe(1234);
    expect(normalizeRefreshRate(undefined)).toBe(DEFAULT_REFRESH_RATE);
    expect(normalizeRefreshRate(NaN)).toBe(DEFAULT_REFRESH_RATE);
  });
});

describe('slice level', () => {
  it('measures the whole slice with the thresholds, not the server level', () => {
    const status = inSlice({ memory_used: 3.3 * GIB, memory_level: 'ok', gpus: [] });
    expect(sliceLevel(status)).toBe('warning'); // 82 %, the status's 0.8 / 0.95
    expect(sliceLevel(status, { warning: 0.9, critical: 0.95 })).toBe('ok');
    expect(sliceLevel(status, { warning: 0.5, critical: 0.8 })).toBe('critical');
  });

  it('takes the worst capped GPU', () => {
    const status = inSlice({
      memory_used: 4 * GIB,
      memory_limit: 8 * GIB,
      gpus: [
        gpu({ index: 0, memory_used: 3.9 * GIB, memory_limit: 4 * GIB }),
        gpu({ index: 1, memory_used: 0.1 * GIB, memory_limit: 4 * GIB })
      ]
    });
    expect(sliceLevel(status)).toBe('critical'); // GPU 0 at 97.5 %, the slice at 50 %
  });

  it('measures a GPU against no more than its total memory', () => {
    const g = gpu({ memory_total: 2 * GIB, memory_used: 1.7 * GIB, memory_limit: 4 * GIB });
    expect(gpuLevel(g)).toBe('warning'); // 85 % of the 2 GiB the GPU has
  });

  it('falls back to the server level without any cap', () => {
    const status = inSlice({
      memory_limit: 0,
      memory_level: 'warning',
      gpus: [gpu({ memory_used: GIB, memory_limit: 0, memory_level: 'warning' })]
    });
    expect(sliceLevel(status)).toBe('warning');
    expect(sliceLevel(inSlice({ memory_limit: 0, memory_level: undefined, gpus: [] }))).toBe('ok');
    expect(gpuLevel(gpu({ memory_limit: 0, memory_level: 'critical' }))).toBe('critical');
  });

  it('uses the server level for an unreadable slice file', () => {
    expect(
      sliceLevel({ kernel_id: 'k', in_slice: true, error: 'gone', memory_level: 'critical' })
    ).toBe('critical');
    expect(sliceLevel({ kernel_id: 'k', in_slice: true, error: 'gone' })).toBe('ok');
  });

  it('is null outside a slice', () => {
    expect(sliceLevel({ kernel_id: 'k', in_slice: false })).toBeNull();
    expect(sliceLevel(null)).toBeNull();
  });
});

describe('texts for the tooltip and the panel', () => {
  it('writes one GPU line', () => {
    expect(gpuText(gpu({ index: 1, memory_used: GIB, memory_limit: 2 * GIB, sm_share: 50, sm_util: 7 }))).toBe(
      'GPU 1: 1.0 / 2.0 GiB · SM 7 % / 50 %'
    );
  });

  it('sums up the slice in the tooltip', () => {
    expect(tooltipText(inSlice())).toBe(
      [
        'GPU slice alice',
        'GPU 0: 1.2 / 4.0 GiB · SM 23 % / 25 %',
        'This kernel: 819 MiB · SM 10 %',
        'Click to show the slice panel'
      ].join('\n')
    );
    expect(tooltipText({ kernel_id: 'k', in_slice: false, reason: 'why' })).toBe('why');
  });

  it('puts the biggest memory user first, then SM, then id', () => {
    const sorted = sortKernels([
      kernel('b', MIB, 5),
      kernel('a', MIB, 5),
      kernel('c', GIB),
      kernel('d', MIB, 50)
    ]);
    expect(sorted.map(k => k.kernel_id)).toEqual(['c', 'd', 'a', 'b']);
  });
});

describe('reading the server answer', () => {
  it('accepts a full answer', () => {
    const json = JSON.parse(JSON.stringify(inSlice()));
    expect(parseKernelStatus(json)).toEqual(inSlice());
  });

  it('accepts a kernel outside a slice', () => {
    expect(parseKernelStatus({ kernel_id: 'k', in_slice: false, reason: 'r' })).toEqual({
      kernel_id: 'k',
      in_slice: false,
      reason: 'r'
    });
  });

  it('rejects what is not a kernel status', () => {
    expect(parseKernelStatus(null)).toBeNull();
    expect(parseKernelStatus([])).toBeNull();
    expect(parseKernelStatus({ in_slice: true })).toBeNull();
    expect(parseKernelStatus({ kernel_id: 'k' })).toBeNull();
  });

  it('cleans up lists of the wrong shape', () => {
    const status = parseKernelStatus({
      kernel_id: 'k',
      in_slice: true,
      gpus: 'none',
      kernels: [null, { kernel_id: 'x', memory_used: 1, sm_util: 0, this_server: true }, { pid: 3 }],
      error: 42
    });
    expect(status?.gpus).toEqual([]);
    expect(status?.kernels?.map(k => k.kernel_id)).toEqual(['x']);
    expect(status?.error).toBe('42');
  });
});

/** inSlice() with this kernel's parking fields. */
function withPark(fields: Record<string, unknown>, overrides: Partial<IKernelSliceStatus> = {}): IKernelSliceStatus {
  const status = inSlice(overrides);
  status.kernel = { ...status.kernel!, ...fields } as IKernelSliceStatus['kernel'];
  return status;
}

describe('parking fields', () => {
  it('reads what the server sends', () => {
    expect(parkInfo({ park_state: 'parked', memory_parked: 8 * GIB, park_wait: 'free memory on the GPU' })).toEqual({
      state: 'parked',
      parked: 8 * GIB,
      wait: 'free memory on the GPU'
    });
    for (const state of ['running', 'parking', 'parked', 'resuming'] as const) {
      expect(parkInfo({ park_state: state }).state).toBe(state);
    }
  });

  it('reads an older server (no fields) as running, nothing parked, no wait', () => {
    const none = { state: 'running', parked: 0, wait: null };
    expect(parkInfo({})).toEqual(none);
    expect(parkInfo(undefined)).toEqual(none);
    expect(parkInfo(null)).toEqual(none);
    expect(parkInfo(kernel('k', GIB))).toEqual(none);
  });

  it('reads nonsense as running, 0 and no wait', () => {
    const odd = { park_state: 'napping', memory_parked: '8', park_wait: '  ' } as unknown as Record<string, unknown>;
    expect(parkInfo(odd)).toEqual({ state: 'running', parked: 0, wait: null });
    expect(parkInfo({ park_state: 'parked', memory_parked: -1, park_wait: null })).toEqual({
      state: 'parked',
      parked: 0,
      wait: null
    });
  });
});

describe('status text while parked', () => {
  it('says parked and how much is in host memory', () => {
    const status = withPark({ park_state: 'parked', memory_parked: 8 * GIB, memory_used: 0 });
    expect(statusText(status)).toBe('vGPU parked · 8.0 GiB in host memory');
    expect(statusText(withPark({ park_state: 'parked', memory_parked: 300 * MIB }))).toBe(
      'vGPU parked · 300 MiB in host memory'
    );
    expect(statusText(withPark({ park_state: 'parked', memory_parked: 0 }))).toBe('vGPU parked');
  });

  it('says parking and resuming while the memory moves', () => {
    expect(statusText(withPark({ park_state: 'parking', memory_parked: 3 * GIB }))).toBe('vGPU parking…');
    expect(statusText(withPark({ park_state: 'resuming', memory_parked: 8 * GIB }))).toBe('vGPU resuming…');
    expect(PARKING_TEXT).toBe('vGPU parking…');
    expect(RESUMING_TEXT).toBe('vGPU resuming…');
  });

  it('keeps the usage text for a running kernel and for an older server', () => {
    const usage = 'vGPU 1.2 / 4.0 GiB · SM 23 % / 25 %';
    expect(statusText(withPark({ park_state: 'running', memory_parked: 0, park_wait: null }))).toBe(usage);
    expect(statusText(inSlice())).toBe(usage); // no parking fields at all
    expect(statusText(inSlice({ kernel: undefined }))).toBe(usage);
    expect(statusText(withPark({ park_state: 'sleeping' }))).toBe(usage);
  });

  it('still says so outside a slice and for an unreadable slice', () => {
    expect(statusText({ kernel_id: 'k', in_slice: false })).toBeNull();
    expect(
      statusText({
        kernel_id: 'k',
        in_slice: true,
        error: 'gone',
        kernel: { memory_used: 0, sm_util: 0, park_state: 'parked', memory_parked: GIB }
      })
    ).toBe(UNREADABLE_TEXT);
  });

  it('leaves the slice usage for the panel', () => {
    const status = withPark({ park_state: 'parked', memory_parked: 8 * GIB });
    expect(sliceText(status)).toBe('vGPU 1.2 / 4.0 GiB · SM 23 % / 25 %');
    expect(sliceText(null)).toBeNull();
  });

  it('is null for the park part of a running kernel', () => {
    expect(parkStatusText(parkInfo({}))).toBeNull();
    expect(parkStatusText(parkInfo({ park_state: 'parked', memory_parked: GIB }))).toBe(
      'vGPU parked · 1.0 GiB in host memory'
    );
  });

  it('gives the status bar a neutral class while parked, parking or resuming', () => {
    expect(PARKED_CLASS).toBe('hami-parked');
    expect(RESUMING_CLASS).toBe('hami-resuming');
    expect(statusParkClass(withPark({ park_state: 'parked', memory_parked: GIB }))).toBe('hami-parked');
    expect(statusParkClass(withPark({ park_state: 'parking' }))).toBe('hami-parked');
    expect(statusParkClass(withPark({ park_state: 'resuming' }))).toBe('hami-resuming');
    expect(statusParkClass(withPark({ park_state: 'running' }))).toBeNull();
    expect(statusParkClass(inSlice())).toBeNull();
    expect(statusParkClass(null)).toBeNull();
    expect(statusParkClass({ kernel_id: 'k', in_slice: false })).toBeNull();
  });
});

describe('tooltip while parked', () => {
  it('tells the parked memory, and what the resume waits for', () => {
    const status = withPark({
      park_state: 'parked',
      memory_used: 0,
      memory_parked: 8 * GIB,
      park_wait: "room under the slice's memory cap"
    });
    expect(tooltipText(status)).toBe(
      [
        'GPU slice alice',
        'GPU 0: 1.2 / 4.0 GiB · SM 23 % / 25 %',
        'This kernel: parked, 8.0 GiB in host memory; it comes back before the next cell',
        "The resume waits for room under the slice's memory cap",
        'Click to show the slice panel'
      ].join('\n')
    );
  });

  it('tells parking and resuming', () => {
    expect(tooltipText(withPark({ park_state: 'parking', memory_parked: 3 * GIB })).split('\n')[2]).toBe(
      'This kernel: parking, 3.0 GiB in host memory so far'
    );
    const resuming = tooltipText(
      withPark({ park_state: 'resuming', memory_parked: 8 * GIB, park_wait: 'free memory on the GPU' })
    ).split('\n');
    expect(resuming[2]).toBe('This kernel: resuming, 8.0 GiB coming back from host memory');
    expect(resuming[3]).toBe('The resume waits for free memory on the GPU');
  });

  it('shows parked memory on the GPU lines when there is some', () => {
    expect(gpuText(gpu({ memory_used: GIB, memory_limit: 4 * GIB, memory_parked: 8 * GIB }))).toBe(
      'GPU 0: 1.0 / 4.0 GiB · SM 0 % · 8.0 GiB parked'
    );
    expect(gpuText(gpu({ memory_used: GIB, memory_limit: 4 * GIB, memory_parked: 0 }))).toBe(
      'GPU 0: 1.0 / 4.0 GiB · SM 0 %'
    );
    expect(gpuText(gpu({ memory_used: GIB, memory_limit: 4 * GIB }))).toBe('GPU 0: 1.0 / 4.0 GiB · SM 0 %');
  });
});

describe('panel rows while parked', () => {
  const parked = (fields: Record<string, unknown> = {}): ISliceKernel =>
    ({ ...kernel('k', 0), park_state: 'parked', memory_parked: 8 * GIB, park_wait: null, ...fields }) as ISliceKernel;

  it('writes the parked memory', () => {
    expect(kernelParkText(parked())).toBe('parked: 8.0 GiB in host memory');
    expect(kernelParkText(parked({ memory_parked: 300 * MIB }))).toBe('parked: 300 MiB in host memory');
  });

  it('adds what a resume waits for', () => {
    expect(kernelParkText(parked({ park_wait: 'free memory on the GPU' }))).toBe(
      'parked: 8.0 GiB in host memory · resume waits for free memory on the GPU'
    );
    expect(
      kernelParkText(parked({ park_state: 'resuming', park_wait: "room under the slice's memory cap" }))
    ).toBe("resuming: 8.0 GiB in host memory · resume waits for room under the slice's memory cap");
    expect(kernelParkText(parked({ park_state: 'resuming' }))).toBe('resuming: 8.0 GiB in host memory');
  });

  it('writes parking progress', () => {
    expect(kernelParkText(parked({ park_state: 'parking', memory_parked: 3 * GIB }))).toBe(
      'parking: 3.0 GiB in host memory so far'
    );
    expect(kernelParkText(parked({ park_state: 'parking', memory_parked: 0 }))).toBe('parking…');
  });

  it('has no park line for a running kernel or one of an older server', () => {
    expect(kernelParkText(parked({ park_state: 'running', memory_parked: 0 }))).toBeNull();
    expect(kernelParkText(kernel('k', GIB))).toBeNull();
    expect(kernelParkText(undefined)).toBeNull();
  });

  it('offers park to a running kernel of this server that holds memory, resume to a parked one', () => {
    expect(parkAction(kernel('k', GIB))).toBe('park'); // an older server: running
    expect(parkAction({ ...kernel('k', GIB), park_state: 'running' })).toBe('park');
    expect(parkAction(kernel('k', 0))).toBeNull(); // nothing to park
    expect(parkAction(kernel('k', GIB, 0, false))).toBeNull(); // another server's
    expect(parkAction(parked())).toBe('resume');
    expect(parkAction(parked({ this_server: false }))).toBeNull();
    expect(parkAction(parked({ park_state: 'parking', memory_used: GIB }))).toBeNull();
    expect(parkAction(parked({ park_state: 'resuming' }))).toBeNull();
  });

  it('sums up a park or resume for the panel', () => {
    expect(
      parkResultText({ kernel_id: '0123456789ab', park_state: 'parked', parked_bytes: 8 * GIB, seconds: 1.24 })
    ).toBe('Parked 01234567: 8.0 GiB moved to host memory in 1.2 s');
    expect(
      resumeResultText({ kernel_id: '0123456789ab', park_state: 'running', restored_bytes: 8 * GIB, seconds: 0.75 })
    ).toBe('Resumed 01234567: 8.0 GiB back on the GPU in 0.8 s');
    expect(parkErrorText('park', '0123456789ab', 'host memory too low')).toBe(
      'Cannot park 01234567: host memory too low'
    );
    expect(parkErrorText('resume', '0123456789ab', ' ')).toBe('Cannot resume 01234567');
  });

  it('keeps the parking fields when reading the server answer', () => {
    const json = {
      ...inSlice(),
      kernel: { memory_used: 0, sm_util: 0, park_state: 'parked', memory_parked: 8 * GIB, park_wait: null },
      gpus: [{ ...gpu(), memory_parked: 8 * GIB }],
      kernels: [parked({ kernel_id: 'k1' })]
    };
    const status = parseKernelStatus(JSON.parse(JSON.stringify(json)));
    expect(statusText(status)).toBe('vGPU parked · 8.0 GiB in host memory');
    expect(kernelParkText(status!.kernels![0])).toBe('parked: 8.0 GiB in host memory');
    expect(status!.gpus![0].memory_parked).toBe(8 * GIB);
  });
});

/* The guard: its real figure beside the reported one, and a slice over its cap. */

/** The answer for a kernel whose slice's GPU 0 the guard sees holding `real` bytes (1 GiB cap). */
function guarded(real: number | null, state: 'ok' | 'over' | null, action: string | null = 'kill'): IKernelSliceStatus {
  const g = gpu({
    memory_used: 364 * MIB,
    memory_limit: GIB,
    sm_share: 25,
    sm_util: 23,
    memory_real: real,
    guard_state: state,
    guard_limit: state === null ? null : GIB,
    guard_reported: state === null ? null : 364 * MIB
  });
  return inSlice({
    memory_used: 364 * MIB,
    memory_limit: GIB,
    gpus: [g],
    memory_real: real,
    guard_state: state,
    guard: { running: state !== null, action, written_unix: 1764060000.5, error: null }
  });
}

describe('the guard', () => {
  it('shows the real figure only where it differs by more than 16 MiB and 2 %', () => {
    const slack = REAL_SLACK_BYTES + 0.02 * 364 * MIB;
    expect(realDiffers(364 * MIB + slack - 1, 364 * MIB)).toBe(false);
    expect(realDiffers(364 * MIB - slack + 1, 364 * MIB)).toBe(false);
    expect(realDiffers(364 * MIB + slack + 1, 364 * MIB)).toBe(true);
    expect(realDiffers(364 * MIB - slack - 1, 364 * MIB)).toBe(true);
    expect(realDiffers(null, 364 * MIB)).toBe(false);

    expect(gpuText(guarded(1.4 * GIB, 'over').gpus![0])).toBe(
      'GPU 0: 0.4 / 1.0 GiB · real 1.4 GiB (guard) · SM 23 % / 25 %'
    );
    expect(realText(guarded(370 * MIB, 'ok').gpus![0])).toBeNull();
    expect(gpuText(guarded(370 * MIB, 'ok').gpus![0])).toBe('GPU 0: 0.4 / 1.0 GiB · SM 23 % / 25 %');
    expect(realText(guarded(0, 'ok').gpus![0])).toBe('real 0 B (guard)');
  });

  it('says what it sees over the cap, with its action', () => {
    const over = guarded(1.4 * GIB, 'over');
    expect(guardOverText(over.gpus![0])).toBe(
      'the guard sees 1.4 GiB really in use on this GPU, over the 1.0 GiB cap (the slice counts 364 MiB)'
    );
    expect(guardOverLines(over)).toEqual([
      "GPU 0: the guard sees 1.4 GiB really in use on this GPU, over the 1.0 GiB cap (the slice counts 364 MiB); the guard's action: kill"
    ]);
    expect(guardOverLines(guarded(1.4 * GIB, 'over', null))[0]).toMatch(/counts 364 MiB\)$/);
    expect(statusGuardClass(over)).toBe(GUARD_OVER_CLASS);
    expect(GUARD_OVER_CLASS).toBe('hami-guard-over');
    expect(tooltipText(over).split('\n')).toEqual([
      'GPU slice alice',
      'GPU 0: 0.4 / 1.0 GiB · real 1.4 GiB (guard) · SM 23 % / 25 %',
      "GPU 0: the guard sees 1.4 GiB really in use on this GPU, over the 1.0 GiB cap (the slice counts 364 MiB); the guard's action: kill",
      'This kernel: 819 MiB · SM 10 %',
      'Click to show the slice panel'
    ]);
  });

  it('is quiet within the cap, without a guard, and for older servers', () => {
    for (const status of [guarded(400 * MIB, 'ok'), guarded(null, null), inSlice()]) {
      expect(guardOverLines(status)).toEqual([]);
      expect(statusGuardClass(status)).toBeNull();
    }
    expect(tooltipText(inSlice())).not.toContain('guard');
    expect(gpuReal(inSlice().gpus![0])).toBeNull(); // no memory_real at all: an older server
    // "over" without a real figure is not believed; nor is a real figure that is not a count.
    expect(gpuGuardOver(gpu({ guard_state: 'over', memory_real: null }))).toBe(false);
    expect(gpuReal(gpu({ memory_real: -1 }))).toBeNull();
  });

  it('says nothing outside a slice or for an unreadable slice file', () => {
    expect(guardOverLines(null)).toEqual([]);
    expect(guardOverLines({ kernel_id: 'k', in_slice: false })).toEqual([]);
    expect(guardOverLines({ ...guarded(1.4 * GIB, 'over'), error: 'hami: damaged' })).toEqual([]);
  });

  it('keeps the fields through parsing', () => {
    const parsed = parseKernelStatus(JSON.parse(JSON.stringify(guarded(1.4 * GIB, 'over'))));
    expect(statusGuardClass(parsed)).toBe(GUARD_OVER_CLASS);
    expect(parsed?.guard?.action).toBe('kill');
  });
});

describe('what the guard parked and a lowered cap (issue 27)', () => {
  const parked = {
    pid: 4242,
    command: 'python train.py',
    user: 'alice',
    process_bytes: 1.5 * GIB,
    unix: 1_000_000,
    why: "held 1.5 GiB past the slice's cap without the preload library"
  };

  function slice(overrides: Partial<IKernelSliceStatus> = {}): IKernelSliceStatus {
    return parseKernelStatus({
      kernel_id: 'k1',
      in_slice: true,
      slice: 'alice',
      path: '/run/hami-jupyter/alice.slice',
      memory_used: 30 * GIB,
      memory_limit: 20 * GIB,
      memory_level: 'critical',
      sm_share: 0,
      sm_util: 0,
      gpus: [gpu({ memory_used: 30 * GIB, memory_limit: 20 * GIB, over_cap_since: 1_000_000 })],
      ...overrides
    }) as IKernelSliceStatus;
  }

  it('says who the guard parked, why, and that its memory is safe', () => {
    const text = guardParkedText(parked, 1_000_000 + 185);
    expect(text).toBe(
      "pid 4242 (python train.py) parked by the guard 3 min ago: held 1.5 GiB past the slice's cap " +
        'without the preload library. Its 1.5 GiB are safe in host memory; it waits until an ' +
        'administrator resumes it (after raising the cap) or ends it'
    );
    expect(guardParkedLines(slice({ guard: { running: true, parked: [parked] } }), 1_000_000)).toEqual([
      guardParkedText(parked, 1_000_000)
    ]);
    expect(guardParkedLines(slice({ guard: { running: true } }), 1_000_000)).toEqual([]);
    expect(guardParkedLines(null, 1_000_000)).toEqual([]);
  });

  it('notes a GPU held over a cap lowered since, with the time of the change', () => {
    const [line] = heldLines(slice());
    expect(line).toBe(
      `GPU 0: over its new 20.0 GiB cap since ${clockText(1_000_000)}, held before the change: new ` +
        'allocations are refused until its use falls below the cap; nothing it holds is taken'
    );
    expect(clockText(1_000_000)).toMatch(/^\d\d:\d\d$/);
    expect(heldLines(slice({ gpus: [gpu()] }))).toEqual([]);
    expect(heldText(gpu({ over_cap_since: null }))).toBeNull();
  });
});

/* Guarantees, park reasons and waits for room (issue 28). */

describe('a guarantee below the cap', () => {
  it('is said in the words of %hami status, only where it differs from the cap', () => {
    const lent = gpu({ memory_used: GIB, memory_limit: 8 * GIB, memory_guarantee: 2 * GIB });
    expect(guaranteeText(lent)).toBe('guaranteed 2.0 GiB of the 8.0 GiB cap');
    expect(guaranteeText(gpu({ memory_limit: 0, memory_guarantee: 4 * GIB }))).toBe('guaranteed 4.0 GiB, no cap');
    expect(guaranteeText(gpu({ memory_limit: 8 * GIB, memory_guarantee: 8 * GIB }))).toBeNull();
    expect(guaranteeText(gpu({ memory_limit: 8 * GIB }))).toBeNull(); // an older server
  });

  it('shows on the GPU line and in the tooltip', () => {
    const lent = gpu({ memory_used: GIB, memory_limit: 8 * GIB, memory_guarantee: 2 * GIB, sm_util: 3 });
    expect(gpuText(lent)).toBe('GPU 0: 1.0 / 8.0 GiB · guaranteed 2.0 GiB of the 8.0 GiB cap · SM 3 %');
    expect(tooltipText(inSlice({ gpus: [lent] })).split('\n')[1]).toBe(gpuText(lent));
    expect(gpuText(gpu({ memory_used: GIB, memory_limit: 8 * GIB, memory_guarantee: 8 * GIB }))).toBe(
      'GPU 0: 1.0 / 8.0 GiB · SM 0 %'
    );
  });

  it('survives reading the server answer', () => {
    const json = { ...inSlice(), gpus: [{ ...gpu({ memory_limit: 8 * GIB }), memory_guarantee: 2 * GIB }] };
    const status = parseKernelStatus(JSON.parse(JSON.stringify(json)));
    expect(guaranteeText(status!.gpus![0])).toBe('guaranteed 2.0 GiB of the 8.0 GiB cap');
  });
});

describe('why a kernel was parked, and a wait for GPU room', () => {
  const parked = (fields: Record<string, unknown> = {}): ISliceKernel =>
    ({ ...kernel('k', 0), park_state: 'parked', memory_parked: 8 * GIB, ...fields }) as ISliceKernel;
  const since = new Date(2026, 10, 26, 14, 2, 30).getTime() / 1000;

  it("says a kernel was parked to make room for another user's work", () => {
    expect(parkReasonText(parked({ park_reason: 'room' }))).toBe("to make room for another user's work");
    expect(kernelParkText(parked({ park_reason: 'room' }))).toBe(
      "parked to make room for another user's work: 8.0 GiB in host memory"
    );
    expect(kernelParkText(parked({ park_reason: 'idle' }))).toBe('parked while idle: 8.0 GiB in host memory');
    expect(kernelParkText(parked({ park_reason: 'asked' }))).toBe('parked on request: 8.0 GiB in host memory');
    // Unknown, missing, or not parked (any more): no reason is made up.
    expect(kernelParkText(parked({ park_reason: 'toString' }))).toBe('parked: 8.0 GiB in host memory');
    expect(parkReasonText(parked({ park_reason: null }))).toBeNull();
    expect(parkReasonText(parked({ park_state: 'resuming', park_reason: 'room' }))).toBeNull();
  });

  it("tells the kernel's own user in the tooltip", () => {
    const status = withPark({ park_state: 'parked', memory_parked: 8 * GIB, memory_used: 0, park_reason: 'room' });
    expect(tooltipText(status).split('\n')[2]).toBe(
      "This kernel: parked to make room for another user's work, 8.0 GiB in host memory; it comes back " +
        'before the next cell'
    );
  });

  it('says how much room a waiting process asked for, since when', () => {
    const wait = { uuid: 'GPU-0', bytes: 8 * GIB, since_unix: since };
    expect(roomWaitText(wait)).toBe('waiting for 8.0 GiB of GPU room since 14:02');
    expect(roomWaitText({ bytes: 512 * MIB })).toBe('waiting for 512 MiB of GPU room');
    expect(roomWaitText(null)).toBeNull();
    expect(roomWaitText(undefined)).toBeNull();
    const waiting = { ...kernel('k', GIB), room_wait: wait };
    expect(kernelNoteText(waiting)).toBe('waiting for 8.0 GiB of GPU room since 14:02');
    expect(kernelNoteText(parked({ park_reason: 'room', room_wait: wait }))).toBe(
      "parked to make room for another user's work: 8.0 GiB in host memory · waiting for 8.0 GiB of GPU " +
        'room since 14:02'
    );
    expect(kernelNoteText(kernel('k', GIB))).toBeNull();
    expect(tooltipText(withPark({ room_wait: wait })).split('\n')[3]).toBe(
      'This kernel is waiting for 8.0 GiB of GPU room since 14:02'
    );
  });
});

describe('a kernel against the cap of its own GPU (issue 35, item 6)', () => {
  const UUIDS = ['GPU-5a1f0000-0000-4000-8000-000000000000', 'GPU-5a1f0000-0000-4000-8000-000000000001'];
  const gpu = (index: number, used: number): IGpuStatus => ({
    index,
    uuid: UUIDS[index],
    memory_total: 16 * GIB,
    memory_used: used,
    memory_limit: 4 * GIB,
    sm_share: 25,
    sm_util: 0
  });
  const kernel = (id: string, onGpu: number, bytes: number): ISliceKernel => ({
    kernel_id: id,
    memory_used: bytes,
    sm_util: 0,
    this_server: true,
    processes: [{ pid: 1, memory_used: { [UUIDS[onGpu]]: bytes } }]
  });
  const status = (
    kernels: ISliceKernel[],
    gpus: IGpuStatus[] = [gpu(0, 3.5 * GIB), gpu(1, 2.6 * GIB)]
  ): IKernelSliceStatus => ({ kernel_id: 'a', in_slice: true, slice: 'alice', sm_share: 25, gpus, kernels });

  it("names the GPU the kernel holds its memory on, not the slice's fullest", () => {
    const onGpu1 = kernel('b', 1, 2.6 * GIB);
    const s = status([kernel('a', 0, 3.5 * GIB), onGpu1]);
    expect(kernelGpu(onGpu1, s)?.index).toBe(1);
    expect(kernelMemoryView(onGpu1, s)).toEqual({ level: 'ok', title: "65 % of GPU 1's cap" });
  });

  it('colours by its own level, never by its rank', () => {
    const s = status([kernel('a', 0, 1.92 * GIB)], [gpu(0, 1.92 * GIB)]);
    // The biggest (and only) kernel at 48 %: no warning; one GPU: "the slice's cap".
    expect(kernelMemoryView(kernel('a', 0, 1.92 * GIB), s)).toEqual({
      level: 'ok',
      title: "48 % of the slice's cap"
    });
    expect(kernelMemoryView(kernel('a', 0, 3.5 * GIB), s).level).toBe('warning');
    expect(kernelMemoryView(kernel('a', 0, 3.9 * GIB), s).level).toBe('critical');
  });

  it("heads the panel with the status bar's words, the slice beneath while parked", () => {
    const parked: IKernelSliceStatus = {
      ...status([]),
      kernel: { memory_used: 0, sm_util: 0, park_state: 'parked', memory_parked: 3.5 * GIB }
    };
    expect(panelHeadline(parked)).toEqual({
      text: 'vGPU parked · 3.5 GiB in host memory',
      slice: 'vGPU 3.5 / 4.0 GiB (GPU 0) · SM 0 % / 25 %'
    });
    const running: IKernelSliceStatus = { ...status([]), kernel: { memory_used: 0, sm_util: 0 } };
    expect(panelHeadline(running)).toEqual({ text: 'vGPU 3.5 / 4.0 GiB (GPU 0) · SM 0 % / 25 %', slice: null });
  });

  it("says a chart's scale", () => {
    expect(scaleText(1.1 * GIB, 'memory')).toBe('1.1 GiB');
    expect(scaleText(100, 'sm')).toBe('100 %');
  });
});

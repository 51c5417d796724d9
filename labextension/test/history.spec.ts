// The ring buffer and the slice's history (src/history.ts): what the charts draw.
import { GIB, MIB } from '../src/format';
import {
  DEFAULT_HISTORY_MINUTES,
  historyCapacity,
  MAX_HISTORY_MINUTES,
  MIN_HISTORY_MINUTES,
  normalizeHistoryMinutes,
  RingBuffer,
  SliceHistory
} from '../src/history';
import { IKernelSliceStatus, ISliceKernel } from '../src/types';
import schema from '../schema/plugin.json';

describe('RingBuffer', () => {
  it('keeps the items oldest first until it is full', () => {
    const ring = new RingBuffer<number>(3);
    expect(ring.length).toBe(0);
    expect(ring.last()).toBeUndefined();
    expect(ring.push(1)).toBeUndefined();
    expect(ring.push(2)).toBeUndefined();
    expect(ring.toArray()).toEqual([1, 2]);
    expect(ring.length).toBe(2);
    expect(ring.last()).toBe(2);
  });

  it('drops the oldest item for each new one once full, and says which', () => {
    const ring = new RingBuffer<number>(3);
    [1, 2, 3].forEach(n => ring.push(n));
    expect(ring.push(4)).toBe(1);
    expect(ring.push(5)).toBe(2);
    expect(ring.toArray()).toEqual([3, 4, 5]);
    expect(ring.length).toBe(3);
    // Far around the circle, the order still holds.
    for (let n = 6; n < 100; n++) {
      ring.push(n);
    }
    expect(ring.toArray()).toEqual([97, 98, 99]);
  });

  it('reads an item from either end', () => {
    const ring = new RingBuffer<string>(4);
    ['a', 'b', 'c', 'd', 'e'].forEach(x => ring.push(x));
    expect(ring.at(0)).toBe('b');
    expect(ring.at(3)).toBe('e');
    expect(ring.at(-1)).toBe('e');
    expect(ring.at(-4)).toBe('b');
    expect(ring.at(4)).toBeUndefined();
    expect(ring.at(-5)).toBeUndefined();
    expect(ring.at(1.5)).toBeUndefined();
  });

  it('shifts and drops from the oldest end', () => {
    const ring = new RingBuffer<number>(5);
    [1, 2, 3, 4, 5, 6].forEach(n => ring.push(n));
    expect(ring.shift()).toBe(2);
    expect(ring.dropWhile(n => n < 5)).toBe(2);
    expect(ring.toArray()).toEqual([5, 6]);
    expect(ring.dropWhile(() => true)).toBe(2);
    expect(ring.shift()).toBeUndefined();
    ring.push(7);
    expect(ring.toArray()).toEqual([7]);
  });

  it('resizes keeping the newest items that fit', () => {
    const ring = new RingBuffer<number>(4);
    [1, 2, 3, 4, 5, 6].forEach(n => ring.push(n));
    ring.resize(2);
    expect(ring.capacity).toBe(2);
    expect(ring.toArray()).toEqual([5, 6]);
    ring.resize(3);
    ring.push(7);
    expect(ring.toArray()).toEqual([5, 6, 7]);
    expect(ring.push(8)).toBe(5);
  });

  it('clears', () => {
    const ring = new RingBuffer<number>(2);
    [1, 2, 3].forEach(n => ring.push(n));
    ring.clear();
    expect(ring.length).toBe(0);
    expect(ring.toArray()).toEqual([]);
    ring.push(4);
    expect(ring.toArray()).toEqual([4]);
  });

  it('refuses a capacity that is not a whole number of at least 1', () => {
    for (const bad of [0, -1, 2.5, NaN, Infinity]) {
      expect(() => new RingBuffer(bad)).toThrow(RangeError);
    }
    expect(() => new RingBuffer(1).resize(0)).toThrow(RangeError);
  });
});

describe('the history setting', () => {
  it('is whole minutes from 1 to 60, 5 when unusable', () => {
    expect(DEFAULT_HISTORY_MINUTES).toBe(5);
    expect(normalizeHistoryMinutes(5)).toBe(5);
    expect(normalizeHistoryMinutes(10.4)).toBe(10);
    expect(normalizeHistoryMinutes(0)).toBe(1);
    expect(normalizeHistoryMinutes(600)).toBe(60);
    expect(normalizeHistoryMinutes('5')).toBe(5);
    expect(normalizeHistoryMinutes(undefined)).toBe(5);
    expect(normalizeHistoryMinutes(NaN)).toBe(5);
  });

  it('says the same as the settings schema', () => {
    const setting = schema.properties.historyMinutes;
    expect(setting.default).toBe(DEFAULT_HISTORY_MINUTES);
    expect(setting.minimum).toBe(MIN_HISTORY_MINUTES);
    expect(setting.maximum).toBe(MAX_HISTORY_MINUTES);
  });

  it('sizes a series for twice the polls of the window at the fastest refresh rate, plus one', () => {
    expect(historyCapacity(5 * 60_000, 500)).toBe(1201);
    expect(historyCapacity(60_000, 2000)).toBe(61);
  });
});

const T0 = 1_700_000_000_000;
const WINDOW = 60_000;

function kernel(id: string, used: number, extra: Partial<ISliceKernel> = {}): ISliceKernel {
  return { kernel_id: id, memory_used: used, sm_util: 5, this_server: true, ...extra };
}

/** An answer for a 1 GiB, SM 25 % slice on one GPU with `kernels`. */
function answer(used: number, kernels: ISliceKernel[], extra: Partial<IKernelSliceStatus> = {}): IKernelSliceStatus {
  return {
    kernel_id: 'k1',
    in_slice: true,
    slice: 'alice',
    path: '/run/hami/slices/alice.slice',
    memory_used: used,
    memory_limit: GIB,
    sm_share: 25,
    sm_util: 10,
    gpus: [
      {
        index: 0,
        memory_used: used,
        memory_limit: GIB,
        sm_share: 25,
        sm_util: 10,
        memory_real: used + MIB,
        memory_parked: 0
      }
    ],
    kernels,
    ...extra
  };
}

function history(): SliceHistory {
  return new SliceHistory({ windowMs: WINDOW, minIntervalMs: 500 });
}

describe('SliceHistory', () => {
  it('gives each GPU and each kernel of an answer a sample', () => {
    const h = history();
    h.record(answer(300 * MIB, [kernel('k1', 200 * MIB), kernel('k2', 100 * MIB, { sm_util: 7 })]), T0);
    expect(h.slice).toBe('/run/hami/slices/alice.slice');
    expect(h.gpuKeys()).toEqual(['0']);
    expect(h.kernelIds().sort()).toEqual(['k1', 'k2']);
    expect(h.gpu('0')).toEqual([
      {
        t: T0,
        gap: false,
        used: 300 * MIB,
        sm: 10,
        cap: GIB,
        share: 25,
        real: 301 * MIB,
        parked: 0,
        state: null
      }
    ]);
    // A kernel is drawn against the slice's cap and share.
    expect(h.kernel('k2')).toEqual([
      { t: T0, gap: false, used: 100 * MIB, sm: 7, cap: GIB, share: 25, real: null, split: null, parked: 0, state: 'running' }
    ]);
    expect(h.kernel('nobody')).toEqual([]);
    expect(h.gpu('9')).toEqual([]);
  });

  it("draws a kernel against its slice's fullest GPU's cap, never the GPUs' caps summed", () => {
    const h = history();
    // Two 4 GiB GPUs, 3.5 GiB on GPU 0, the top level summed as an older server sent it.
    const gpus = [
      { index: 0, memory_used: 3.5 * GIB, memory_limit: 4 * GIB, sm_share: 25, sm_util: 10 },
      { index: 1, memory_used: 0, memory_limit: 4 * GIB, sm_share: 25, sm_util: 0 }
    ];
    h.record(answer(3.5 * GIB, [kernel('k1', 3.5 * GIB)], { memory_limit: 8 * GIB, gpus }), T0);
    expect(h.kernel('k1')[0].cap).toBe(4 * GIB);
    expect(h.gpu('0')[0].cap).toBe(4 * GIB);
    // Before the slice used a GPU: the cap every GPU gets.
    const fresh = history();
    fresh.record(answer(0, [kernel('k1', 0)], { memory_limit: 2 * GIB, gpus: [] }), T0);
    expect(fresh.kernel('k1')[0].cap).toBe(2 * GIB);
  });

  it('reads missing and broken fields of older servers as nothing, not as numbers', () => {
    const h = history();
    const status = answer(0, [kernel('k1', 0, { park_state: 'sleeping' as never, memory_parked: -3 })]);
    status.gpus = [{ index: 1, memory_used: NaN, memory_limit: 0, sm_share: 0, sm_util: -1 }];
    h.record(status, T0);
    const [gpu] = h.gpu('1');
    expect(gpu).toMatchObject({ used: 0, sm: 0, cap: 0, share: 0, real: null, parked: 0, state: null });
    expect(h.kernel('k1')[0]).toMatchObject({ parked: 0, state: 'running' });
  });

  it('keeps a kernel parking state and its parked bytes', () => {
    const h = history();
    h.record(answer(0, [kernel('k1', 0, { park_state: 'parked', memory_parked: 800 * MIB })]), T0);
    expect(h.kernel('k1')[0]).toMatchObject({ used: 0, parked: 800 * MIB, state: 'parked' });
  });

  it('puts a gap into every series when the server does not answer, one per run of failures', () => {
    const h = history();
    h.record(answer(100 * MIB, [kernel('k1', 100 * MIB)]), T0);
    h.recordGap(T0 + 1000);
    h.recordGap(T0 + 2000);
    h.record(answer(200 * MIB, [kernel('k1', 200 * MIB)]), T0 + 3000);
    for (const series of [h.gpu('0'), h.kernel('k1')]) {
      expect(series.map(s => [s.t, s.gap, s.used])).toEqual([
        [T0, false, 100 * MIB],
        [T0 + 1000, true, null],
        [T0 + 3000, false, 200 * MIB]
      ]);
    }
  });

  it('puts a gap into the series of a kernel or GPU an answer lacks', () => {
    const h = history();
    h.record(answer(100 * MIB, [kernel('k1', 60 * MIB), kernel('k2', 40 * MIB)]), T0);
    h.record(answer(60 * MIB, [kernel('k1', 60 * MIB)]), T0 + 1000);
    expect(h.kernel('k2').map(s => s.gap)).toEqual([false, true]);
    expect(h.kernel('k1').map(s => s.gap)).toEqual([false, false]);
  });

  it('reads an unreadable slice file as a gap, and an answer outside a slice as nothing', () => {
    const h = history();
    h.record(answer(100 * MIB, [kernel('k1', 100 * MIB)]), T0);
    h.record({ kernel_id: 'k1', in_slice: true, slice: 'alice', path: '/run/hami/slices/alice.slice', error: 'hami: corrupt' }, T0 + 1000);
    h.record({ kernel_id: 'k9', in_slice: false, reason: 'not hami' }, T0 + 2000);
    expect(h.gpu('0').map(s => s.gap)).toEqual([false, true]);
    expect(h.slice).toBe('/run/hami/slices/alice.slice');
  });

  it('starts afresh for another slice', () => {
    const h = history();
    h.record(answer(100 * MIB, [kernel('k1', 100 * MIB)]), T0);
    h.record(answer(5 * MIB, [kernel('b1', 5 * MIB)], { slice: 'bob', path: '/run/hami/slices/bob.slice' }), T0 + 1000);
    expect(h.slice).toBe('/run/hami/slices/bob.slice');
    expect(h.kernelIds()).toEqual(['b1']);
    expect(h.gpu('0').map(s => s.used)).toEqual([5 * MIB]);
  });

  it('drops samples older than the window but the last one before it', () => {
    const h = history();
    for (let i = 0; i <= 130; i++) {
      h.record(answer(i * MIB, [kernel('k1', i * MIB)]), T0 + i * 1000);
    }
    const times = () => h.gpu('0').map(s => s.t);
    // The window is 70 s .. 130 s: a reading right at its left edge needs none before it.
    expect(times()[0]).toBe(T0 + 70_000);
    expect(times()).toHaveLength(61);
    // At 130.5 s it starts at 70.5 s: 70 s, the last reading before it, stays (the line enters there).
    h.record(answer(MIB, [kernel('k1', MIB)]), T0 + 130_500);
    expect(times()[0]).toBe(T0 + 70_000);
    expect(times()[1]).toBe(T0 + 71_000);
    expect(times()).toHaveLength(62);
  });

  it('forgets a kernel without a reading in the window', () => {
    const h = history();
    h.record(answer(100 * MIB, [kernel('k1', 60 * MIB), kernel('gone', 40 * MIB)]), T0);
    h.record(answer(60 * MIB, [kernel('k1', 60 * MIB)]), T0 + 30_000);
    expect(h.kernelIds().sort()).toEqual(['gone', 'k1']);
    h.record(answer(60 * MIB, [kernel('k1', 60 * MIB)]), T0 + WINDOW + 1);
    expect(h.kernelIds()).toEqual(['k1']);
  });

  it('never holds more than its capacity, however often it is fed', () => {
    const h = new SliceHistory({ windowMs: 10_000, minIntervalMs: 500 });
    expect(h.capacity).toBe(41);
    for (let i = 0; i < 500; i++) {
      h.record(answer(MIB, [kernel('k1', MIB)]), T0 + i * 10);
    }
    expect(h.gpu('0')).toHaveLength(41);
    expect(h.gpu('0')[40].t).toBe(T0 + 4990);
  });

  it('resizes its buffers with the window', () => {
    const h = new SliceHistory({ windowMs: 10_000, minIntervalMs: 500 });
    for (let i = 0; i < 40; i++) {
      h.record(answer(MIB, [kernel('k1', MIB)]), T0 + i * 250);
    }
    h.windowMs = 2_000;
    expect(h.windowMs).toBe(2_000);
    expect(h.capacity).toBe(9);
    expect(h.gpu('0')).toHaveLength(9);
    expect(h.gpu('0')[8].t).toBe(T0 + 39 * 250);
    expect(() => (h.windowMs = 0)).toThrow(RangeError);
  });

  it('clears', () => {
    const h = history();
    h.record(answer(MIB, [kernel('k1', MIB)]), T0);
    h.clear();
    expect(h.slice).toBeNull();
    expect(h.gpuKeys()).toEqual([]);
    expect(h.kernelIds()).toEqual([]);
  });
});

// Issue 41, item 2: a kernel on two GPUs with 2.0 GiB caps, 2.6 GiB in all
// (0.8 GiB on GPU 0, 1.8 GiB on GPU 1), was drawn against one GPU's cap: 131 %.
describe('a kernel on several GPUs', () => {
  const UUIDS = ['GPU-a', 'GPU-b'];
  const twoGpus = (limits = [2 * GIB, 2 * GIB]): IKernelSliceStatus =>
    answer(0, [], {
      gpus: [
        { index: 0, uuid: UUIDS[0], memory_used: 0.8 * GIB, memory_limit: limits[0], sm_share: 25, sm_util: 0 },
        { index: 1, uuid: UUIDS[1], memory_used: 1.8 * GIB, memory_limit: limits[1], sm_share: 25, sm_util: 0 }
      ]
    });
  const onBoth = kernel('k1', 2.6 * GIB, {
    processes: [{ pid: 1, memory_used: { [UUIDS[0]]: 0.8 * GIB, [UUIDS[1]]: 1.8 * GIB } }]
  });

  it('is drawn against the caps of the GPUs it holds memory on, added up as its bytes are', () => {
    const h = history();
    const status = twoGpus();
    status.kernels = [onBoth];
    h.record(status, T0);
    const [sample] = h.kernel('k1');
    expect(sample.used).toBe(2.6 * GIB);
    expect(sample.cap).toBe(4 * GIB);
    expect(sample.used! / sample.cap).toBeLessThan(1);
    expect(sample.split).toEqual([
      { gpu: 0, used: 0.8 * GIB, cap: 2 * GIB },
      { gpu: 1, used: 1.8 * GIB, cap: 2 * GIB }
    ]);
  });

  it('on one GPU of several, against that GPU alone', () => {
    const h = history();
    const status = twoGpus();
    status.kernels = [kernel('k1', 1.8 * GIB, { processes: [{ pid: 1, memory_used: { [UUIDS[1]]: 1.8 * GIB } }] })];
    h.record(status, T0);
    expect(h.kernel('k1')[0]).toMatchObject({ cap: 2 * GIB, split: null });
  });

  it('has no cap line where one of its GPUs has no cap', () => {
    const h = history();
    const status = twoGpus([2 * GIB, 0]);
    status.kernels = [onBoth];
    h.record(status, T0);
    expect(h.kernel('k1')[0].cap).toBe(0);
  });
});

// Issue 41, item 7: the GPU as a whole, beside the slice.
describe('the whole GPU', () => {
  const whole = (util: number | null, extra = {}) => ({
    index: 0,
    uuid: 'GPU-a',
    name: 'HAMi Simulated GPU',
    memory_total: 16 * GIB,
    memory_used: 5 * GIB,
    utilization: util,
    power_w: 320,
    power_limit_w: 700,
    temperature_c: 55,
    slice_used: GIB,
    slices: [],
    others_used: 4 * GIB,
    ...extra
  });

  it('keeps a series per GPU of every answer, NVML\'s figures and this slice\'s bytes', () => {
    const h = history();
    h.record(answer(GIB, [], { whole_gpus: [whole(45)] }), T0);
    h.record(answer(GIB, [], { whole_gpus: [whole(null, { power_w: null })] }), T0 + 1000);
    expect(h.whole('0')).toEqual([
      { t: T0, gap: false, util: 45, used: 5 * GIB, total: 16 * GIB, slice: GIB, power: 320, power_limit: 700, temp: 55 },
      { t: T0 + 1000, gap: false, util: null, used: 5 * GIB, total: 16 * GIB, slice: GIB, power: null, power_limit: 700, temp: 55 }
    ]);
  });

  it('breaks where the server gave none, and takes the server\'s earlier samples in front', () => {
    const h = history();
    h.record(answer(GIB, [], { whole_gpus: [whole(45)] }), T0);
    h.record(answer(GIB, []), T0 + 1000);
    expect(h.whole('0').map(s => s.gap)).toEqual([false, true]);
    h.recordGap(T0 + 2000);
    expect(h.whole('0')).toHaveLength(2); // one gap is enough
    const kept = { t: T0 - 5000, gap: false, util: 10, used: GIB, total: 16 * GIB, slice: 0, power: 80, power_limit: 700, temp: 33 };
    expect(h.seed('/run/hami/slices/alice.slice', { whole: { '0': [kept] } })).toBe(1);
    expect(h.whole('0')[0]).toEqual(kept);
  });
});

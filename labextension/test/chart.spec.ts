// The charts' maths (src/chart.ts): scales, line paths, gaps, the cap and share lines, parked spans, labels.
import {
  CHART_HEIGHT,
  CHART_WIDTH,
  formatWindow,
  niceCeil,
  HEADROOM,
  IChartFrame,
  isParked,
  legendEntries,
  limitPath,
  linePath,
  memoryLabel,
  memoryMax,
  MIN_MEMORY_MAX,
  parkedSpans,
  parkedValue,
  realValue,
  smLabel,
  smMax,
  smValue,
  timeX,
  usedValue,
  valueY,
  visible
} from '../src/chart';
import { GIB, MIB } from '../src/format';
import { ISample } from '../src/history';

const T0 = 1_700_000_000_000;

/** A 100 x 40 chart of the last 100 s ending at T0 + 100 s: one unit of x per second. */
const FRAME: IChartFrame = { width: 100, height: 40, now: T0 + 100_000, windowMs: 100_000, maxGapMs: 5_000 };

/** A GPU reading at second `s` (T0-relative) with `used` bytes. */
function gpu(s: number, used: number, extra: Partial<ISample> = {}): ISample {
  return { t: T0 + s * 1000, gap: false, used, sm: 10, cap: GIB, share: 25, real: null, parked: 0, state: null, ...extra };
}

function kernelAt(s: number, used: number, extra: Partial<ISample> = {}): ISample {
  return gpu(s, used, { state: 'running', ...extra });
}

function gap(s: number): ISample {
  return { t: T0 + s * 1000, gap: true, used: null, sm: null, cap: 0, share: 0, real: null, parked: 0, state: null };
}

/** The points of a path: one list of [x, y] per subpath (each `M` starts one). */
function subpaths(d: string): number[][][] {
  return d
    .split('M')
    .filter(Boolean)
    .map(part =>
      part
        .split('L')
        .map(p => p.trim().split(/\s+/).map(Number))
    );
}

describe('the scales', () => {
  it('puts time along x, the window start at the left edge and now at the right', () => {
    expect(timeX(T0, FRAME)).toBe(0);
    expect(timeX(T0 + 100_000, FRAME)).toBe(100);
    expect(timeX(T0 + 25_500, FRAME)).toBe(25.5);
    expect(timeX(T0 - 10_000, FRAME)).toBe(-10);
  });

  it('puts a value up from the bottom, clamped to the chart', () => {
    expect(valueY(0, 100, 40)).toBe(40);
    expect(valueY(100, 100, 40)).toBe(0);
    expect(valueY(25, 100, 40)).toBe(30);
    expect(valueY(150, 100, 40)).toBe(0);
    expect(valueY(-5, 100, 40)).toBe(40);
    expect(valueY(5, 0, 40)).toBe(40);
    expect(valueY(1, 3, 40)).toBe(26.67);
  });

  it('tops a memory chart at a round figure above the cap while the use stays below it', () => {
    // Issue 41, item 6: a 2.0 GiB cap gave a scale of "0–2.2 GiB"; it reads 2.5 GiB now.
    expect(memoryMax([gpu(0, 300 * MIB, { cap: 2 * GIB })])).toBe(2.5 * GIB);
    const max = memoryMax([gpu(0, 300 * MIB), gpu(1, 600 * MIB)]);
    expect(max).toBe(1.2 * GIB);
    expect(max).toBeGreaterThanOrEqual(GIB * (1 + HEADROOM));
    // The cap line then lies at 1 / 1.2 of the height, inside the chart.
    expect(valueY(GIB, max, 40)).toBe(6.67);
    expect(valueY(GIB, max, CHART_HEIGHT)).toBeCloseTo(CHART_HEIGHT * (1 - 1 / 1.2), 1);
  });

  it('tops it at the highest of used, parked and the guard bytes once one passes the cap', () => {
    expect(memoryMax([gpu(0, 300 * MIB, { real: 2 * GIB })])).toBe(2.5 * GIB);
    expect(memoryMax([gpu(0, 0, { parked: 3 * GIB })])).toBe(4 * GIB);
    expect(memoryMax([gpu(0, 4 * GIB, { cap: 0 })])).toBe(5 * GIB);
    // Below a GiB in MiB: 700 MiB of use without a cap, a scale of 800 MiB.
    expect(memoryMax([gpu(0, 700 * MIB, { cap: 0 })])).toBe(800 * MIB);
    // Gaps count for nothing; an idle slice without a cap gets the smallest scale.
    expect(memoryMax([gap(0), gpu(1, 0, { cap: 0 })])).toBe(MIN_MEMORY_MAX);
    expect(memoryMax([])).toBe(MIN_MEMORY_MAX);
  });

  it('rounds a scale up to 1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6 or 8 times a power of ten', () => {
    expect([0.9, 1, 1.05, 1.3, 2.1, 2.6, 3.5, 4.2, 5.5, 7, 9, 11, 2000.5].map(v => niceCeil(v))).toEqual([
      1, 1, 1.2, 1.5, 2.5, 3, 4, 5, 6, 8, 10, 12, 2500
    ]);
    expect(niceCeil(2 * GIB, GIB)).toBe(2 * GIB);
    expect(niceCeil(0)).toBe(0);
  });

  it('tops an SM chart at the whole GPU unless something goes beyond it', () => {
    expect(smMax([gpu(0, 0, { sm: 30 })])).toBe(100);
    expect(smMax([gpu(0, 0, { sm: 150 })])).toBe(200);
    expect(smMax([])).toBe(100);
  });
});

describe('the line of a series', () => {
  it('joins the readings from the oldest to the newest', () => {
    const d = linePath([gpu(10, 0), gpu(12, 512 * MIB), gpu(14, GIB)], usedValue, GIB, FRAME);
    expect(d).toBe('M10 40L12 20L14 0');
  });

  it('breaks at a gap sample: the server did not answer', () => {
    const samples = [gpu(10, 0), gpu(11, GIB), gap(12), gpu(13, GIB), gpu(14, 0)];
    const d = linePath(samples, usedValue, GIB, FRAME);
    expect(d).toBe('M10 40L11 0M13 0L14 40');
    expect(subpaths(d)).toEqual([
      [
        [10, 40],
        [11, 0]
      ],
      [
        [13, 0],
        [14, 40]
      ]
    ]);
  });

  it('breaks between readings further apart than maxGapMs (the poll stood by)', () => {
    const d = linePath([gpu(10, 0), gpu(15, 0), gpu(21, 0)], usedValue, GIB, FRAME);
    expect(d).toBe('M10 40L15 40M21 40L21 40');
  });

  it('draws a reading alone between breaks as a dot (a zero-length segment)', () => {
    expect(linePath([gap(9), gpu(10, GIB), gap(11)], usedValue, GIB, FRAME)).toBe('M10 0L10 0');
    expect(linePath([gpu(50, GIB)], usedValue, GIB, FRAME)).toBe('M50 0L50 0');
  });

  it('is empty with nothing to draw', () => {
    expect(linePath([], usedValue, GIB, FRAME)).toBe('');
    expect(linePath([gap(1), gap(2)], usedValue, GIB, FRAME)).toBe('');
    expect(linePath([gpu(1, GIB)], realValue, GIB, FRAME)).toBe('');
  });

  it('enters from the left edge through the last reading before the window, and leaves the older out', () => {
    const samples = [gpu(-20, 0), gpu(-2, 0), gpu(2, GIB), gpu(4, GIB)];
    expect(visible(samples, FRAME).map(s => s.t)).toEqual([T0 - 2000, T0 + 2000, T0 + 4000]);
    expect(linePath(samples, usedValue, GIB, FRAME)).toBe('M-2 40L2 0L4 0');
  });

  it('leaves out readings after now', () => {
    expect(linePath([gpu(99, 0), gpu(101, GIB)], usedValue, GIB, FRAME)).toBe('M99 40L99 40');
  });

  it('draws the guard real bytes as a second line where the guard sent them', () => {
    const samples = [gpu(10, 100 * MIB, { real: 512 * MIB }), gpu(11, 100 * MIB), gpu(12, 100 * MIB, { real: GIB })];
    expect(linePath(samples, realValue, GIB, FRAME)).toBe('M10 20L10 20M12 0L12 0');
  });

  it('draws SM use on its own scale', () => {
    expect(linePath([gpu(10, 0, { sm: 0 }), gpu(11, 0, { sm: 50 })], smValue, 100, FRAME)).toBe('M10 40L11 20');
  });
});

describe('the cap and share lines', () => {
  it('lies level at the cap across the whole chart while the cap stays', () => {
    const samples = [gpu(40, 0), gpu(50, 500 * MIB), gpu(60, GIB)];
    const max = memoryMax(samples);
    const y = valueY(GIB, max, FRAME.height);
    expect(limitPath(samples, s => s.cap, max, FRAME)).toBe(`M0 ${y}H100`);
    expect(y).toBe(6.67);
  });

  it('lies at the share on an SM chart', () => {
    const samples = [gpu(40, 0, { share: 25 }), gpu(60, 0, { share: 25 })];
    expect(limitPath(samples, s => s.share, 100, FRAME)).toBe('M0 30H100');
  });

  it('steps where the cap changed', () => {
    const samples = [gpu(20, 0, { cap: GIB }), gpu(30, 0, { cap: GIB }), gpu(60, 0, { cap: 2 * GIB })];
    expect(limitPath(samples, s => s.cap, 2 * GIB, FRAME)).toBe('M0 20H60V0H100');
  });

  it('stops where the cap was lifted and starts where one came', () => {
    const samples = [gpu(20, 0, { cap: GIB }), gpu(50, 0, { cap: 0 }), gpu(70, 0, { cap: GIB })];
    expect(limitPath(samples, s => s.cap, 2 * GIB, FRAME)).toBe('M0 20H50M70 20H100');
  });

  it('is not broken by a gap, and absent without any limit', () => {
    expect(limitPath([gpu(20, 0), gap(30), gpu(40, 0)], s => s.cap, 2 * GIB, FRAME)).toBe('M0 20H100');
    expect(limitPath([gpu(20, 0, { share: 0 })], s => s.share, 100, FRAME)).toBe('');
    expect(limitPath([gap(20)], s => s.cap, GIB, FRAME)).toBe('');
  });
});

describe('parked memory', () => {
  it('is a kernel that does not run, or a GPU with bytes parked from it', () => {
    expect(isParked(kernelAt(0, 0, { state: 'parked' }))).toBe(true);
    expect(isParked(kernelAt(0, 0, { state: 'parking' }))).toBe(true);
    expect(isParked(kernelAt(0, 0, { state: 'resuming' }))).toBe(true);
    expect(isParked(kernelAt(0, 0, { state: 'running', parked: 5 }))).toBe(false);
    expect(isParked(gpu(0, 0, { parked: 5 }))).toBe(true);
    expect(isParked(gpu(0, 0))).toBe(false);
    expect(isParked(gap(0))).toBe(false);
  });

  it('draws a parked kernel as a segment of its own at its parked bytes, not as used memory', () => {
    const samples = [
      kernelAt(10, GIB),
      kernelAt(11, 0, { state: 'parked', parked: GIB }),
      kernelAt(12, 0, { state: 'parked', parked: GIB }),
      kernelAt(13, GIB, { state: 'running' })
    ];
    expect(linePath(samples, usedValue, GIB, FRAME)).toBe('M10 0L10 0M13 0L13 0');
    expect(linePath(samples, parkedValue, GIB, FRAME)).toBe('M11 0L12 0');
    expect(parkedSpans(samples, FRAME)).toEqual([[11, 13]]);
  });

  it('keeps a GPU used line whole beside its parked bytes', () => {
    const samples = [gpu(10, 100 * MIB), gpu(11, 100 * MIB, { parked: 512 * MIB }), gpu(12, 100 * MIB)];
    expect(linePath(samples, usedValue, GIB, FRAME)).toBe('M10 36.09L11 36.09L12 36.09');
    expect(linePath(samples, parkedValue, GIB, FRAME)).toBe('M11 20L11 20');
    expect(parkedSpans(samples, FRAME)).toEqual([[11, 12]]);
  });

  it('spans to the right edge while still parked, and from the left edge when parked before', () => {
    const samples = [kernelAt(-5, 0, { state: 'parked', parked: GIB }), kernelAt(20, GIB), kernelAt(90, 0, { state: 'parked' })];
    expect(parkedSpans(samples, FRAME)).toEqual([
      [0, 20],
      [90, 100]
    ]);
    expect(parkedSpans([kernelAt(10, GIB)], FRAME)).toEqual([]);
  });
});

describe('the labels in words', () => {
  const frame = { now: T0 + 100_000, windowMs: 5 * 60_000 };

  it('says the window', () => {
    expect(formatWindow(5 * 60_000)).toBe('5 min');
    expect(formatWindow(60 * 60_000)).toBe('1 h');
    expect(formatWindow(90_000)).toBe('90 s');
  });

  it('gives the latest memory figures against the cap, and the highest', () => {
    const samples = [gpu(10, 900 * MIB), gpu(20, 864 * MIB)];
    expect(memoryLabel('GPU 0', samples, frame)).toBe(
      'GPU 0 memory, last 5 min: 864 MiB in use of the 1.0 GiB cap (84 %); highest 900 MiB'
    );
  });

  it('adds the guard bytes and the parked memory of a GPU; says when there is no cap', () => {
    const samples = [gpu(20, 300 * MIB, { real: 400 * MIB, parked: 2 * GIB, cap: 0 })];
    expect(memoryLabel('GPU 1', samples, frame)).toBe(
      'GPU 1 memory, last 5 min: 300 MiB in use, no cap; the guard reads 400 MiB; 2.0 GiB parked in host memory; highest 300 MiB'
    );
  });

  it('says a kernel is parked and how much it holds in host memory', () => {
    const samples = [kernelAt(10, 800 * MIB), kernelAt(20, 0, { state: 'parked', parked: 800 * MIB })];
    expect(memoryLabel('Kernel 0123abcd', samples, frame)).toBe(
      'Kernel 0123abcd memory, last 5 min: parked, 800 MiB in host memory; highest 800 MiB'
    );
  });

  it('says when the server did not answer the last poll, and when there are no readings', () => {
    expect(memoryLabel('GPU 0', [gpu(10, 100 * MIB), gap(20)], frame)).toBe(
      'GPU 0 memory, last 5 min: no answer from the server at the last reading; before that 100 MiB in use of the 1.0 GiB cap (10 %); highest 100 MiB'
    );
    expect(memoryLabel('GPU 0', [gap(20)], frame)).toBe('GPU 0 memory, last 5 min: no readings yet');
    expect(smLabel('GPU 0', [], frame)).toBe('GPU 0 SM, last 5 min: no readings yet');
  });

  it('gives the SM use against the share', () => {
    expect(smLabel('GPU 0', [gpu(10, 0, { sm: 20 }), gpu(20, 0, { sm: 3 })], frame)).toBe(
      'GPU 0 SM, last 5 min: 3 % in use of a 25 % share; highest 20 %'
    );
    expect(smLabel('Kernel 0123abcd', [kernelAt(20, 0, { sm: 7, share: 0 })], frame)).toBe(
      'Kernel 0123abcd SM, last 5 min: 7 % in use, no SM limit; highest 7 %'
    );
  });
});

it('has a viewBox wider than high, like the panel', () => {
  expect(CHART_WIDTH).toBeGreaterThan(CHART_HEIGHT);
});

describe('the legend', () => {
  it('lists only what a chart draws: no parked entry while nothing was parked', () => {
    const series = [[gpu(10, GIB), gpu(20, GIB)], [kernelAt(10, GIB), kernelAt(20, GIB)]];
    expect(legendEntries(series, FRAME)).toEqual({ limit: true, parked: false, real: false });
  });

  it('lists parked memory while a chart shows a parked span, and the guard while it reads', () => {
    const parked = [kernelAt(10, GIB), kernelAt(20, 0, { state: 'parked', parked: GIB })];
    expect(legendEntries([parked], FRAME).parked).toBe(true);
    const gpuParked = [gpu(20, 0, { parked: GIB })];
    expect(legendEntries([gpuParked], FRAME).parked).toBe(true);
    expect(legendEntries([[gpu(20, GIB, { real: GIB })]], FRAME).real).toBe(true);
  });

  it('forgets what left the window, and lists no cap or share where there is none', () => {
    // Parked 150 s before the end of a 100 s window, then running again: off the charts.
    const old = [kernelAt(-60, 0, { state: 'parked', parked: GIB }), kernelAt(-40, GIB), kernelAt(50, GIB)];
    expect(legendEntries([old], FRAME).parked).toBe(false);
    const uncapped = [gpu(20, GIB, { cap: 0, share: 0 }), gap(30)];
    expect(legendEntries([uncapped], FRAME)).toEqual({ limit: false, parked: false, real: false });
    expect(legendEntries([], FRAME)).toEqual({ limit: false, parked: false, real: false });
  });
});

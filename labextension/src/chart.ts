/**
 * The maths of the panel's charts: where a sample lies in the SVG's own
 * units (time along x, newest at the right edge; a value up from the bottom),
 * the scale of a memory or SM chart, the paths of its lines (broken where the
 * server gave no reading), the cap or share line, the spans of parked memory,
 * and the chart's label in words. Pure functions of the samples (history.ts),
 * no DOM, so the unit tests run in plain Node; chartview.ts puts the results
 * into SVG elements.
 */

import { clockText, formatBytes, formatPercent, GIB, MIB } from './format';
import { ISample, ITimed, IWholeSample } from './history';

/** The drawing area of a chart, in the units of its viewBox, and the time it spans. */
export interface IChartFrame {
  width: number;
  height: number;
  /** The time at the right edge, ms since the epoch. */
  now: number;
  /** The time the width spans, ms: the left edge is `now - windowMs`. */
  windowMs: number;
  /**
   * Two readings further apart than this are not joined (the page was hidden,
   * the poll stood by): the line breaks between them, as at a gap sample.
   */
  maxGapMs: number;
}

/** The viewBox of every chart; CSS stretches it to the chart's box. */
export const CHART_WIDTH = 300;
export const CHART_HEIGHT = 40;

/**
 * Room above the highest value (or the cap), as a fraction of it, before the
 * scale's top is rounded up to a round figure (niceMax): the cap line stays
 * inside.
 */
export const HEADROOM = 0.05;

/** The round figures a scale tops at, per power of ten: 1.2 GiB, 2.5 GiB, 800 MiB, 100 %. */
const NICE_STEPS = [1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10];

/**
 * `value` rounded up to a round figure in `unit` (1, 1.2, 1.5, 2, 2.5, 3, 4,
 * 5, 6 or 8 times a power of ten of it): a scale reads "0–2.5 GiB" for a
 * 2.0 GiB cap, never "0–2.2 GiB". 0 and less: 0.
 */
export function niceCeil(value: number, unit = 1): number {
  if (!(value > 0) || !Number.isFinite(value)) {
    return 0;
  }
  const v = value / unit;
  const power = Math.pow(10, Math.floor(Math.log10(v)));
  for (const step of NICE_STEPS) {
    // A hair of slack: 2.0000001 is 2, not the next step.
    if (step * power >= v * (1 - 1e-9)) {
      return Number((step * power * unit).toPrecision(12));
    }
  }
  return 10 * power * unit;
}

/** A memory scale's round top: in GiB from 1 GiB on, else in MiB. */
function niceBytes(bytes: number): number {
  return niceCeil(bytes, bytes * (1 - 1e-9) >= GIB / (1 + HEADROOM) ? GIB : MIB);
}

/** The smallest top of a memory chart's scale: an idle slice without a cap is no flat line at the top. */
export const MIN_MEMORY_MAX = 64 * MIB;

/** The top of an SM chart's scale when nothing goes higher: the whole GPU. */
export const SM_MAX = 100;

/** Coordinates keep two decimals: enough at any size a chart is shown. */
function round(value: number): number {
  return Math.round(value * 100) / 100;
}

/** x of time `t`: 0 at `now - windowMs`, `width` at `now`; outside that range beyond the edges. */
export function timeX(t: number, frame: IChartFrame): number {
  return round(((t - (frame.now - frame.windowMs)) / frame.windowMs) * frame.width);
}

/** y of `value` on a scale from 0 (the bottom, `height`) to `max` (the top, 0); clamped to the chart. */
export function valueY(value: number, max: number, height: number): number {
  if (!(max > 0)) {
    return height;
  }
  const fraction = Math.min(1, Math.max(0, value / max));
  return round(height - fraction * height);
}

/** The largest of the numbers, 0 for none. */
function largest(values: Iterable<number | null>): number {
  let top = 0;
  for (const v of values) {
    if (v !== null && Number.isFinite(v) && v > top) {
      top = v;
    }
  }
  return top;
}

/**
 * The top of a memory chart's scale: the highest of what it draws (used,
 * parked and the guard's bytes, and every cap) plus HEADROOM, at least
 * MIN_MEMORY_MAX. With a cap the line of the cap lies at 1 / (1 + HEADROOM)
 * of the height as long as nothing passed it.
 */
export function memoryMax(samples: readonly ISample[]): number {
  const top = largest(
    samples.flatMap(s => (s.gap ? [] : [s.used, s.real, s.parked, s.cap]))
  );
  return Math.max(MIN_MEMORY_MAX, niceBytes(top * (1 + HEADROOM)));
}

/**
 * The top of an SM chart's scale: SM_MAX (the whole GPU), or the highest use
 * or share plus HEADROOM where one goes beyond it (a kernel on several GPUs).
 */
export function smMax(samples: readonly ISample[]): number {
  const top = largest(samples.flatMap(s => (s.gap ? [] : [s.sm, s.share])));
  return top > SM_MAX ? niceCeil(top * (1 + HEADROOM)) : SM_MAX;
}

/** Samples inside the frame, plus the last one before it (where a line enters from the left edge). */
export function visible<T extends ITimed>(samples: readonly T[], frame: IChartFrame): T[] {
  const start = frame.now - frame.windowMs;
  let first = 0;
  while (first + 1 < samples.length && samples[first + 1].t <= start) {
    first++;
  }
  return samples.slice(first).filter(s => s.t <= frame.now);
}

/**
 * The SVG path of a line through `value` of each sample: `"M x y L x y …"`,
 * a new `M` (the line breaks) after a gap sample, where `value` is null, and
 * between readings further apart than `maxGapMs`. A reading alone between two
 * breaks is a zero-length segment (`"M x y L x y"`), drawn as a dot by round
 * line caps. Empty when there is nothing to draw.
 */
export function linePath<T extends ITimed>(
  samples: readonly T[],
  value: (sample: T) => number | null,
  max: number,
  frame: IChartFrame
): string {
  const parts: string[] = [];
  let previous: T | null = null;
  let runLength = 0;
  let lastPoint = '';
  const closeRun = (): void => {
    if (runLength === 1) {
      parts.push(`L${lastPoint}`);
    }
    runLength = 0;
  };
  for (const sample of visible(samples, frame)) {
    const v = sample.gap ? null : value(sample);
    if (v === null || !Number.isFinite(v)) {
      closeRun();
      previous = null;
      continue;
    }
    const point = `${timeX(sample.t, frame)} ${valueY(v, max, frame.height)}`;
    const joined = previous !== null && sample.t - previous.t <= frame.maxGapMs;
    if (!joined) {
      closeRun();
    }
    parts.push(`${joined ? 'L' : 'M'}${point}`);
    runLength++;
    lastPoint = point;
    previous = sample;
  }
  closeRun();
  return parts.join('');
}

/**
 * The SVG path of a limit (the memory cap, the SM share) as it was over time:
 * level while it stays, a step where it changed. It reaches from the left edge
 * (the first limit known is taken for the time before it) to the right edge
 * (the last one, until a new answer says otherwise); gaps do not break it, a
 * limit does not change with an unanswered poll. Where the limit is 0 (none)
 * there is no line. Empty when no sample has a limit.
 */
export function limitPath<T extends ITimed>(
  samples: readonly T[],
  limit: (sample: T) => number,
  max: number,
  frame: IChartFrame
): string {
  const readings = visible(samples, frame).filter(s => !s.gap);
  const parts: string[] = [];
  let current = 0;
  readings.forEach((sample, i) => {
    const value = Math.max(0, limit(sample) || 0);
    if (i > 0 && value === current) {
      return;
    }
    const x = i === 0 ? 0 : Math.min(frame.width, Math.max(0, timeX(sample.t, frame)));
    if (current > 0) {
      parts.push(`H${x}`);
    }
    if (value > 0) {
      const y = valueY(value, max, frame.height);
      parts.push(current > 0 ? `V${y}` : `M${x} ${y}`);
    }
    current = value;
  });
  if (current > 0) {
    parts.push(`H${frame.width}`);
  }
  return parts.join('');
}

/** The latest limit of the samples (the last reading's), 0 when none. */
export function latestLimit<T extends ITimed>(samples: readonly T[], limit: (sample: T) => number): number {
  const reading = lastReading(samples);
  return reading ? limit(reading) : 0;
}

/** Whether a sample holds parked memory: a kernel not running, a GPU with bytes parked from it. */
export function isParked(sample: ISample): boolean {
  if (sample.gap) {
    return false;
  }
  return sample.state !== null ? sample.state !== 'running' : sample.parked > 0;
}

/**
 * The time spans in which memory was parked, as `[x0, x1]` pairs within the
 * chart: from the first parked reading to the next reading that is not (or the
 * right edge, while it stays parked), clamped to the edges.
 */
export function parkedSpans(samples: readonly ISample[], frame: IChartFrame): Array<[number, number]> {
  const spans: Array<[number, number]> = [];
  const clamp = (x: number): number => Math.min(frame.width, Math.max(0, x));
  let start: number | null = null;
  for (const sample of visible(samples, frame)) {
    const parked = isParked(sample);
    if (parked && start === null) {
      start = clamp(timeX(sample.t, frame));
    } else if (!parked && start !== null) {
      spans.push([start, clamp(timeX(sample.t, frame))]);
      start = null;
    }
  }
  if (start !== null) {
    spans.push([start, frame.width]);
  }
  return spans;
}

/** The bytes on the GPU, where the chart draws them as used: a kernel's while it runs, a GPU's always. */
export function usedValue(sample: ISample): number | null {
  return sample.state !== null && isParked(sample) ? null : sample.used;
}

/** The parked bytes, where they are drawn as their own (dashed) segment: while memory is parked. */
export function parkedValue(sample: ISample): number | null {
  return isParked(sample) ? sample.parked : null;
}

/** The guard's real bytes (the second line of a GPU's memory chart). */
export function realValue(sample: ISample): number | null {
  return sample.real;
}

export function smValue(sample: ISample): number | null {
  return sample.sm;
}

/** The newest sample that is a reading (no gap); `null` when none. */
export function lastReading<T extends ITimed>(samples: readonly T[]): T | null {
  for (let i = samples.length - 1; i >= 0; i--) {
    if (!samples[i].gap) {
      return samples[i];
    }
  }
  return null;
}

/** Which of the legend's optional entries any chart draws now (the line of use always is). */
export interface ILegendEntries {
  /** A cap or share line. */
  limit: boolean;
  /** Parked memory (a span, a dashed segment). */
  parked: boolean;
  /** The guard's real bytes. */
  real: boolean;
}

/**
 * The legend's entries for `series` (every GPU's and kernel's samples) drawn
 * in `frame`: an entry is listed only while some chart draws it, so the
 * legend never explains a line that is not there.
 */
export function legendEntries(
  series: ReadonlyArray<readonly ISample[]>,
  frame: Pick<IChartFrame, 'now' | 'windowMs'>
): ILegendEntries {
  const entries: ILegendEntries = { limit: false, parked: false, real: false };
  const shown = { ...frame, width: CHART_WIDTH, height: CHART_HEIGHT, maxGapMs: Infinity };
  for (const samples of series) {
    for (const sample of visible(samples, shown)) {
      if (sample.gap) {
        continue;
      }
      entries.limit ||= sample.cap > 0 || sample.share > 0;
      entries.parked ||= isParked(sample);
      entries.real ||= sample.real !== null;
    }
  }
  return entries;
}

/** A window in words: `"5 min"`, `"90 s"`, `"1 h"`. */
export function formatWindow(ms: number): string {
  const seconds = Math.round(ms / 1000);
  if (seconds % 3600 === 0 && seconds >= 3600) {
    return `${seconds / 3600} h`;
  }
  if (seconds % 60 === 0 && seconds >= 60) {
    return `${seconds / 60} min`;
  }
  return `${seconds} s`;
}

/** The readings within the window (gaps left out). */
function readingsIn<T extends ITimed>(samples: readonly T[], frame: Pick<IChartFrame, 'now' | 'windowMs'>): T[] {
  const start = frame.now - frame.windowMs;
  return samples.filter(s => !s.gap && s.t >= start && s.t <= frame.now);
}

/** The start of a label: what the server said last, when the newest poll got no answer. */
function staleNote(samples: readonly ITimed[]): string {
  const newest = samples[samples.length - 1];
  return newest?.gap ? 'no answer from the server at the last reading; before that ' : '';
}

/**
 * The memory chart's label in words, with the latest figures, e.g.
 * `"GPU 0 memory, last 5 min: 864 MiB in use of the 1.0 GiB cap (84 %);
 * the guard reads 900 MiB; highest 864 MiB"`. A parked kernel reads
 * `"…: parked, 800 MiB in host memory; highest …"`, a GPU with parked memory
 * adds `"; 800 MiB parked in host memory"`. `"…: no readings yet"` without any.
 */
export function memoryLabel(
  name: string,
  samples: readonly ISample[],
  frame: Pick<IChartFrame, 'now' | 'windowMs'>
): string {
  const head = `${name} memory, last ${formatWindow(frame.windowMs)}: `;
  const readings = readingsIn(samples, frame);
  const latest = readings[readings.length - 1];
  if (!latest) {
    return `${head}no readings yet`;
  }
  const parts: string[] = [];
  const used = latest.used ?? 0;
  const split = latest.split ?? [];
  if (latest.state !== null && isParked(latest)) {
    parts.push(`${latest.state}, ${formatBytes(latest.parked)} in host memory`);
  } else if (split.length > 1) {
    parts.push(splitText(used, latest.cap, split));
  } else if (latest.cap > 0) {
    parts.push(
      `${formatBytes(used)} in use of the ${formatBytes(latest.cap)} cap (${formatPercent((used / latest.cap) * 100)})`
    );
  } else {
    parts.push(`${formatBytes(used)} in use, no cap`);
  }
  if (latest.real !== null) {
    parts.push(`the guard reads ${formatBytes(latest.real)}`);
  }
  if (latest.state === null && latest.parked > 0) {
    parts.push(`${formatBytes(latest.parked)} parked in host memory`);
  }
  parts.push(`highest ${formatBytes(largest(readings.map(s => s.used)))}`);
  return head + staleNote(samples) + parts.join('; ');
}

/** `"GPU 0 and GPU 1"`, `"GPU 0, GPU 1 and GPU 2"`. */
function gpuList(indices: readonly number[]): string {
  const names = indices.map(i => `GPU ${i}`);
  return names.length > 1 ? `${names.slice(0, -1).join(', ')} and ${names[names.length - 1]}` : names.join('');
}

/**
 * A kernel's memory on several GPUs in words: the sum against the sum of
 * their caps, then each GPU against its own: `"2.6 GiB in use on GPU 0 and
 * GPU 1, of their 4.0 GiB of caps (65 %): GPU 0 800 MiB of its 2.0 GiB cap
 * (39 %), GPU 1 1.8 GiB of its 2.0 GiB cap (91 %)"`.
 */
export function splitText(used: number, cap: number, split: ReadonlyArray<{ gpu: number; used: number; cap: number }>): string {
  const where = gpuList(split.map(s => s.gpu));
  const whole =
    cap > 0
      ? `${formatBytes(used)} in use on ${where}, of their ${formatBytes(cap)} of caps (${formatPercent((used / cap) * 100)})`
      : `${formatBytes(used)} in use on ${where}`;
  const each = split.map(s =>
    s.cap > 0
      ? `GPU ${s.gpu} ${formatBytes(s.used)} of its ${formatBytes(s.cap)} cap (${formatPercent((s.used / s.cap) * 100)})`
      : `GPU ${s.gpu} ${formatBytes(s.used)}, no cap`
  );
  return `${whole}: ${each.join(', ')}`;
}

/**
 * The SM chart's label in words, e.g. `"GPU 0 SM, last 5 min: 3 % in use of
 * a 25 % share; highest 20 %"` (`"…: 3 % in use, no SM limit; …"`).
 */
export function smLabel(
  name: string,
  samples: readonly ISample[],
  frame: Pick<IChartFrame, 'now' | 'windowMs'>
): string {
  const head = `${name} SM, last ${formatWindow(frame.windowMs)}: `;
  const readings = readingsIn(samples, frame);
  const latest = readings[readings.length - 1];
  if (!latest) {
    return `${head}no readings yet`;
  }
  const sm = formatPercent(latest.sm ?? 0);
  const now = latest.share > 0 ? `${sm} in use of a ${formatPercent(latest.share)} share` : `${sm} in use, no SM limit`;
  return `${head}${staleNote(samples)}${now}; highest ${formatPercent(largest(readings.map(s => s.sm)))}`;
}

/* The time axis and the reading under the pointer. */

/**
 * The time axis under a chart: a tick at each end, where along the width
 * (0..1) and what it says: `"−5 min"`, `"now"` (a chart in a narrow panel is
 * about 100 px wide: room for two).
 */
export function timeTicks(windowMs: number): Array<{ at: number; text: string }> {
  return [
    { at: 0, text: `\u2212${formatWindow(windowMs)}` },
    { at: 1, text: 'now' }
  ];
}

/**
 * The reading nearest time `t` (a pointer over the chart), within `maxGapMs`
 * of it: `null` where there is none (a gap, before the first reading).
 */
export function readingAt<T extends ITimed>(samples: readonly T[], t: number, maxGapMs: number): T | null {
  let best: T | null = null;
  for (const sample of samples) {
    if (sample.gap) {
      continue;
    }
    if (best === null || Math.abs(sample.t - t) < Math.abs(best.t - t)) {
      best = sample;
    }
  }
  return best !== null && Math.abs(best.t - t) <= maxGapMs ? best : null;
}

/** `"14:02:31"`: the local time of ms since the epoch, with seconds. */
export function clockSeconds(ms: number): string {
  const when = new Date(ms);
  return `${clockText(ms / 1000)}:${String(when.getSeconds()).padStart(2, '0')}`;
}

/**
 * A memory chart's reading under the pointer: `"14:02:31 · 864 MiB of the
 * 1.0 GiB cap"` (`"… · parked, 800 MiB in host memory"`, `"… · 864 MiB, no
 * cap"`).
 */
export function memoryReadout(sample: ISample): string {
  const when = clockSeconds(sample.t);
  if (sample.state !== null && isParked(sample)) {
    return `${when} · ${sample.state}, ${formatBytes(sample.parked)} in host memory`;
  }
  const used = formatBytes(sample.used ?? 0);
  const split = sample.split ?? [];
  if (split.length > 1) {
    return `${when} · ${used}: ` + split.map(s => `GPU ${s.gpu} ${formatBytes(s.used)}`).join(', ');
  }
  return sample.cap > 0 ? `${when} · ${used} of the ${formatBytes(sample.cap)} cap` : `${when} · ${used}, no cap`;
}

/** An SM chart's reading under the pointer: `"14:02:31 · SM 20 % of a 25 % share"`. */
export function smReadout(sample: ISample): string {
  const sm = formatPercent(sample.sm ?? 0);
  return `${clockSeconds(sample.t)} · SM ${sm}` + (sample.share > 0 ? ` of a ${formatPercent(sample.share)} share` : '');
}

/* The whole GPU's charts (nvdashboard's figures): utilization, memory, power, temperature. */

export type WholeKind = 'util' | 'memory' | 'power' | 'temp';

/** What a whole-GPU chart draws of its samples: its line, its limit line, its scale, its words. */
export interface IWholeSpec {
  /** The line. */
  value: (s: IWholeSample) => number | null;
  /** A second line (the memory chart: this slice's bytes); none elsewhere. */
  second?: (s: IWholeSample) => number | null;
  /** The limit line (the GPU's memory, the power limit); 0 or missing: none. */
  limit?: (s: IWholeSample) => number;
  /** The top of the scale for these samples. */
  max: (samples: readonly IWholeSample[]) => number;
  /** A figure in words: `"45 %"`, `"40.1 GiB"`, `"312 W"`, `"61 °C"`. */
  text: (value: number) => string;
  /** What the chart is of, in words. */
  what: string;
}

/** The largest figure of the readings (value and limit), 0 for none. */
function wholeLargest(samples: readonly IWholeSample[], ...values: Array<(s: IWholeSample) => number | null>): number {
  return largest(samples.flatMap(s => (s.gap ? [] : values.map(v => v(s)))));
}

const watts = (w: number): string => `${Math.round(w)} W`;
const degrees = (c: number): string => `${Math.round(c)} °C`;

export const WHOLE_SPECS: Readonly<Record<WholeKind, IWholeSpec>> = Object.freeze({
  util: {
    value: s => s.util,
    max: () => 100,
    text: formatPercent,
    what: 'utilization'
  },
  memory: {
    value: s => s.used,
    second: s => s.slice,
    // The scale tops at the GPU's memory: the top edge is "full".
    max: samples => Math.max(MIN_MEMORY_MAX, wholeLargest(samples, s => s.used, s => s.total)),
    text: formatBytes,
    what: 'memory'
  },
  power: {
    value: s => s.power,
    limit: s => s.power_limit ?? 0,
    max: samples => niceCeil(Math.max(1, wholeLargest(samples, s => s.power, s => s.power_limit)) * (1 + HEADROOM)),
    text: watts,
    what: 'power'
  },
  temp: {
    value: s => s.temp,
    // Degrees from 0 up to a round figure above the warmest reading (at least 100 °C).
    max: samples => Math.max(100, niceCeil(wholeLargest(samples, s => s.temp) * (1 + HEADROOM))),
    text: degrees,
    what: 'temperature'
  }
});

/**
 * A whole-GPU chart's label in words, e.g. `"GPU 0 as a whole, power, last
 * 5 min: 312 W of its 700 W limit; highest 420 W"`; the memory chart adds
 * this slice's share: `"…: 40.1 GiB in use of 80.0 GiB, this slice 3.5 GiB;
 * highest 41.0 GiB"`.
 */
export function wholeLabel(
  name: string,
  kind: WholeKind,
  samples: readonly IWholeSample[],
  frame: Pick<IChartFrame, 'now' | 'windowMs'>
): string {
  const spec = WHOLE_SPECS[kind];
  const head = `${name} as a whole, ${spec.what}, last ${formatWindow(frame.windowMs)}: `;
  const readings = readingsIn(samples, frame).filter(s => spec.value(s) !== null);
  const latest = readings[readings.length - 1];
  if (!latest) {
    return `${head}no readings from NVML yet`;
  }
  const value = spec.value(latest) ?? 0;
  const limit = spec.limit?.(latest) ?? 0;
  let now = spec.text(value);
  if (kind === 'memory') {
    now += ` in use of ${formatBytes(latest.total ?? 0)}` + (latest.slice !== null ? `, this slice ${formatBytes(latest.slice)}` : '');
  } else if (kind === 'power' && limit > 0) {
    now += ` of its ${watts(limit)} limit`;
  } else if (kind === 'util') {
    now += ' busy';
  }
  return `${head}${staleNote(samples)}${now}; highest ${spec.text(largest(readings.map(s => spec.value(s))))}`;
}

/** A whole-GPU chart's reading under the pointer: `"14:02:31 · 312 W"` (memory: `"… · 40.1 GiB, this slice 3.5 GiB"`). */
export function wholeReadout(kind: WholeKind, sample: IWholeSample): string {
  const spec = WHOLE_SPECS[kind];
  const value = spec.value(sample);
  const text = value === null ? 'no figure' : spec.text(value);
  const slice = kind === 'memory' && sample.slice !== null ? `, this slice ${formatBytes(sample.slice)}` : '';
  return `${clockSeconds(sample.t)} · ${text}${slice}`;
}

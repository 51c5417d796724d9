/**
 * The small live charts of the panel, in plain SVG: a GPU's or a kernel's
 * memory use (against the memory cap) or SM use (against the SM share) over
 * the last minutes (UsageChart), and a GPU as a whole: its utilization,
 * memory, power and temperature (WholeChart). The geometry comes from
 * chart.ts; here it only goes into the elements, which are made once and
 * updated on every poll. Each chart has a time axis under it, and the pointer
 * over it reads the figures at that moment (a cursor line, and the reading in
 * place of the caption).
 *
 * Stable hooks for browser tests: the chart `.hami-chart` with
 * `.hami-chart-memory`, `.hami-chart-sm` or `.hami-chart-whole-<kind>`
 * (util, memory, power, temp) and `data-chart` (e.g. `gpu-0`, `kernel-<id>`,
 * `whole-0`); its `svg.hami-chart-svg` (the viewBox is CHART_WIDTH x
 * CHART_HEIGHT, `data-max`: the value at the top, bytes, percent, watts or
 * degrees); the lines `path.hami-chart-line` (used, SM use, the whole GPU's
 * figure), `path.hami-chart-limit` (the cap, the share, the GPU's memory, the
 * power limit; `data-value`: the latest one), `path.hami-chart-parked`,
 * `path.hami-chart-real` (the guard's bytes), `path.hami-chart-second` (the
 * whole GPU's memory chart: this slice's bytes) and the parked spans
 * `rect.hami-chart-span`; the caption `.hami-chart-caption`, on a line above
 * the SVG (never over the cap line) with the scale `.hami-chart-scale` at its
 * right: "0–1.2 GiB", the values at the bottom and the top of the chart; the
 * time axis `.hami-chart-axis` under it ("5 min ago", "2.5 min ago", "now");
 * under the pointer, the chart has the class `hami-chart-reading`, its
 * caption says the reading (`.hami-chart-readout`) and `line.hami-chart-cursor`
 * marks its time.
 */

import {
  CHART_HEIGHT,
  CHART_WIDTH,
  IChartFrame,
  lastReading,
  latestLimit,
  limitPath,
  linePath,
  memoryLabel,
  memoryMax,
  memoryReadout,
  parkedSpans,
  parkedValue,
  readingAt,
  realValue,
  smLabel,
  smMax,
  smReadout,
  smValue,
  timeTicks,
  timeX,
  usedValue,
  WHOLE_SPECS,
  WholeKind,
  wholeLabel,
  wholeReadout
} from './chart';
import { formatBytes, formatPercent, scaleText } from './format';
import { ISample, ITimed, IWholeSample } from './history';

const SVG_NS = 'http://www.w3.org/2000/svg';

export type ChartKind = 'memory' | 'sm';

/** What a chart needs of the time besides its size: the right edge, the window, the gap rule. */
export type ChartTime = Omit<IChartFrame, 'width' | 'height'>;

function svgElement<K extends keyof SVGElementTagNameMap>(
  tag: K,
  className: string,
  parent: Element
): SVGElementTagNameMap[K] {
  const node = document.createElementNS(SVG_NS, tag);
  if (className) {
    node.setAttribute('class', className);
  }
  parent.appendChild(node);
  return node;
}

function setPath(path: SVGPathElement, d: string): void {
  // An empty `d` is no error, but nothing to draw either: leave it out.
  if (d === '') {
    path.removeAttribute('d');
  } else {
    path.setAttribute('d', d);
  }
}

/**
 * What every chart has: the head (caption and scale), the SVG with its title,
 * the time axis, and the reading under the pointer. A subclass draws its
 * lines (`draw`) and says what a reading is (`readout`).
 */
abstract class LineChart<T extends ITimed> {
  constructor(cls: string, key: string) {
    this.node = document.createElement('div');
    this.node.className = `hami-chart ${cls}`;
    this.node.dataset.chart = key;

    // The SVG's label says it in words: the caption, scale and axis are for the eye only.
    const head = document.createElement('div');
    head.className = 'hami-chart-head';
    head.setAttribute('aria-hidden', 'true');
    this._caption = document.createElement('span');
    this._caption.className = 'hami-chart-caption';
    this._scale = document.createElement('span');
    this._scale.className = 'hami-chart-scale';
    head.append(this._caption, this._scale);
    this.node.appendChild(head);

    const svg = svgElement('svg', 'hami-chart-svg', this.node);
    svg.setAttribute('viewBox', `0 0 ${CHART_WIDTH} ${CHART_HEIGHT}`);
    svg.setAttribute('preserveAspectRatio', 'none');
    svg.setAttribute('role', 'img');
    this.svg = svg;
    this._title = svgElement('title', '', svg);
    this.spans = svgElement('g', 'hami-chart-spans', svg);

    this._axis = document.createElement('div');
    this._axis.className = 'hami-chart-axis';
    this._axis.setAttribute('aria-hidden', 'true');
    this.node.appendChild(this._axis);

    svg.addEventListener('pointermove', this);
    svg.addEventListener('pointerleave', this);
  }

  readonly node: HTMLDivElement;

  handleEvent(event: Event): void {
    if (event.type === 'pointermove') {
      const box = this.svg.getBoundingClientRect();
      const x = (event as PointerEvent).clientX - box.left;
      this._pointer = box.width > 0 ? Math.min(1, Math.max(0, x / box.width)) : null;
    } else if (event.type === 'pointerleave') {
      this._pointer = null;
    }
    this._showReading();
  }

  /** Draws `samples` (oldest first) ending at `time.now`. */
  update(samples: readonly T[], time: ChartTime): void {
    this._samples = samples;
    this._time = time;
    const frame: IChartFrame = { ...time, width: CHART_WIDTH, height: CHART_HEIGHT };
    const { max, label, caption, scale } = this.draw(samples, frame);
    this.svg.dataset.max = String(max);
    this._scale.textContent = `0–${scale}`;
    this._scale.title = `The chart's scale: 0 at the bottom, ${scale} at the top`;
    this.svg.setAttribute('aria-label', label);
    this._title.textContent = label;
    this._captionText = caption;
    this._setAxis(time.windowMs);
    this._showReading();
  }

  /** Draws the lines for `samples` in `frame`; the scale's top, the label, the caption, the scale's words. */
  protected abstract draw(
    samples: readonly T[],
    frame: IChartFrame
  ): { max: number; label: string; caption: string; scale: string };

  /** The reading of one sample in words (the pointer is over it). */
  protected abstract readout(sample: T): string;

  protected line(cls: string): SVGPathElement {
    return svgElement('path', cls, this.svg);
  }

  private _setAxis(windowMs: number): void {
    if (this._axisWindow === windowMs) {
      return;
    }
    this._axisWindow = windowMs;
    this._axis.textContent = '';
    for (const tick of timeTicks(windowMs)) {
      const span = document.createElement('span');
      span.className = 'hami-chart-tick';
      span.textContent = tick.text;
      this._axis.appendChild(span);
    }
  }

  /** The reading under the pointer in place of the caption, and its cursor; the caption without one. */
  private _showReading(): void {
    const time = this._time;
    const reading =
      this._pointer !== null && time !== null
        ? readingAt(this._samples, time.now - time.windowMs + this._pointer * time.windowMs, time.maxGapMs)
        : null;
    this.node.classList.toggle('hami-chart-reading', reading !== null);
    this._caption.classList.toggle('hami-chart-readout', reading !== null);
    this._caption.textContent = reading !== null ? this.readout(reading) : this._captionText;
    if (reading !== null && time !== null) {
      if (this._cursor === null) {
        this._cursor = svgElement('line', 'hami-chart-cursor', this.svg);
        this._cursor.setAttribute('y1', '0');
        this._cursor.setAttribute('y2', String(CHART_HEIGHT));
      }
      const x = String(timeX(reading.t, { ...time, width: CHART_WIDTH, height: CHART_HEIGHT }));
      this._cursor.setAttribute('x1', x);
      this._cursor.setAttribute('x2', x);
    } else if (this._cursor !== null) {
      this._cursor.remove();
      this._cursor = null;
    }
  }

  protected readonly svg: SVGSVGElement;
  protected readonly spans: SVGGElement;
  private _caption: HTMLSpanElement;
  private _captionText = '';
  private _scale: HTMLSpanElement;
  private _title: SVGTitleElement;
  private _axis: HTMLDivElement;
  private _axisWindow: number | null = null;
  private _cursor: SVGLineElement | null = null;
  private _pointer: number | null = null;
  private _samples: readonly T[] = [];
  private _time: ChartTime | null = null;
}

/** A GPU's or a kernel's memory (against the cap) or SM use (against the share). */
export class UsageChart extends LineChart<ISample> {
  /**
   * @param kind memory or SM use
   * @param name what the chart is of, in words: `"GPU 0"`, `"Kernel analysis.ipynb"`
   * @param key its `data-chart`: `"gpu-0"`, `"kernel-<id>"`
   */
  constructor(
    readonly kind: ChartKind,
    name: string,
    key: string
  ) {
    super(`hami-chart-${kind}`, key);
    this.name = name;
    this._limit = this.line('hami-chart-limit');
    if (kind === 'memory') {
      this._real = this.line('hami-chart-real');
      this._parked = this.line('hami-chart-parked');
    }
    this._line = this.line('hami-chart-line');
  }

  /** What the chart is of, in words (a kernel's notebook may be renamed). */
  name: string;

  protected draw(
    samples: readonly ISample[],
    frame: IChartFrame
  ): { max: number; label: string; caption: string; scale: string } {
    const memory = this.kind === 'memory';
    const max = memory ? memoryMax(samples) : smMax(samples);
    const limitOf = memory ? (s: ISample) => s.cap : (s: ISample) => s.share;

    setPath(this._line, linePath(samples, memory ? usedValue : smValue, max, frame));
    setPath(this._limit, limitPath(samples, limitOf, max, frame));
    this._limit.dataset.value = String(latestLimit(samples, limitOf));
    if (this._real) {
      setPath(this._real, linePath(samples, realValue, max, frame));
    }
    if (this._parked) {
      setPath(this._parked, linePath(samples, parkedValue, max, frame));
    }

    // Parked spans: a band behind the lines. Few of them: made anew each time.
    this.spans.textContent = '';
    if (memory) {
      for (const [x0, x1] of parkedSpans(samples, frame)) {
        const rect = svgElement('rect', 'hami-chart-span', this.spans);
        rect.setAttribute('x', String(x0));
        rect.setAttribute('y', '0');
        rect.setAttribute('width', String(Math.max(0.5, x1 - x0)));
        rect.setAttribute('height', String(CHART_HEIGHT));
      }
    }
    const label = memory ? memoryLabel(this.name, samples, frame) : smLabel(this.name, samples, frame);
    return { max, label, caption: this._captionFor(samples), scale: scaleText(max, this.kind) };
  }

  protected readout(sample: ISample): string {
    return this.kind === 'memory' ? memoryReadout(sample) : smReadout(sample);
  }

  /** The caption's few words: `"memory 864 MiB"`, `"memory parked"`, `"SM 3 %"`. */
  private _captionFor(samples: readonly ISample[]): string {
    const latest = lastReading(samples);
    if (this.kind === 'sm') {
      return latest ? `SM ${formatPercent(latest.sm ?? 0)}` : 'SM';
    }
    if (!latest) {
      return 'memory';
    }
    if (latest.state !== null && latest.state !== 'running') {
      return `memory ${latest.state}`;
    }
    return `memory ${formatBytes(latest.used ?? 0)}`;
  }

  private _limit: SVGPathElement;
  private _real: SVGPathElement | null = null;
  private _parked: SVGPathElement | null = null;
  private _line: SVGPathElement;
}

/** A memory chart and an SM chart side by side, for one GPU or one kernel. */
export class ChartPair {
  constructor(name: string, key: string) {
    this.node = document.createElement('div');
    this.node.className = 'hami-chart-pair';
    this.memory = new UsageChart('memory', name, key);
    this.sm = new UsageChart('sm', name, key);
    this.node.append(this.memory.node, this.sm.node);
  }

  readonly node: HTMLDivElement;
  readonly memory: UsageChart;
  readonly sm: UsageChart;

  /** What both charts are of, in words. */
  set name(name: string) {
    this.memory.name = name;
    this.sm.name = name;
  }

  update(samples: readonly ISample[], time: ChartTime): void {
    this.memory.update(samples, time);
    this.sm.update(samples, time);
  }
}

/** One figure of a GPU as a whole over time: utilization, memory, power or temperature. */
export class WholeChart extends LineChart<IWholeSample> {
  constructor(
    readonly kind: WholeKind,
    private readonly _name: string,
    key: string
  ) {
    super(`hami-chart-whole hami-chart-whole-${kind}`, key);
    const spec = WHOLE_SPECS[kind];
    this._limit = this.line('hami-chart-limit');
    this._second = spec.second ? this.line('hami-chart-second') : null;
    this._line = this.line('hami-chart-line');
  }

  protected draw(
    samples: readonly IWholeSample[],
    frame: IChartFrame
  ): { max: number; label: string; caption: string; scale: string } {
    const spec = WHOLE_SPECS[this.kind];
    const max = spec.max(samples);
    setPath(this._line, linePath(samples, spec.value, max, frame));
    if (this._second && spec.second) {
      setPath(this._second, linePath(samples, spec.second, max, frame));
    }
    const limit = spec.limit ?? (() => 0);
    setPath(this._limit, limitPath(samples, limit, max, frame));
    this._limit.dataset.value = String(latestLimit(samples, limit));
    const latest = lastReading(samples);
    const value = latest ? spec.value(latest) : null;
    return {
      max,
      label: wholeLabel(this._name, this.kind, samples, frame),
      caption: `${spec.what} ${value !== null ? spec.text(value) : '?'}`,
      scale: spec.text(max)
    };
  }

  protected readout(sample: IWholeSample): string {
    return wholeReadout(this.kind, sample);
  }

  private _limit: SVGPathElement;
  private _second: SVGPathElement | null;
  private _line: SVGPathElement;
}

/** The four charts of a GPU as a whole, two by two. */
export class WholeCharts {
  constructor(name: string, key: string) {
    this.node = document.createElement('div');
    this.node.className = 'hami-chart-pair hami-whole-charts';
    for (const kind of ['util', 'memory', 'power', 'temp'] as WholeKind[]) {
      const chart = new WholeChart(kind, name, key);
      this.charts.push(chart);
      this.node.appendChild(chart.node);
    }
  }

  readonly node: HTMLDivElement;
  readonly charts: WholeChart[] = [];

  update(samples: readonly IWholeSample[], time: ChartTime): void {
    for (const chart of this.charts) {
      chart.update(samples, time);
    }
  }
}

/**
 * One small live chart of the panel, in plain SVG: a GPU's or a kernel's
 * memory use (against the memory cap) or SM use (against the SM share) over
 * the last minutes. The geometry comes from chart.ts; here it only goes into
 * the elements, which are made once and updated on every poll.
 *
 * Stable hooks for browser tests: the chart `.hami-chart` with
 * `.hami-chart-memory` or `.hami-chart-sm` and `data-chart` (e.g. `gpu-0`,
 * `kernel-<id>`); its `svg.hami-chart-svg` (the viewBox is CHART_WIDTH x
 * CHART_HEIGHT, `data-max`: the value at the top, bytes or percent); the lines
 * `path.hami-chart-line` (used, or SM use), `path.hami-chart-limit` (the cap or
 * the share; `data-value`: the latest one), `path.hami-chart-parked`,
 * `path.hami-chart-real` (the guard's bytes) and the parked spans
 * `rect.hami-chart-span`; the caption `.hami-chart-caption`, on a line above
 * the SVG (never over the cap line) with the scale `.hami-chart-scale` at its
 * right: "0–1.1 GiB", the values at the bottom and the top of the chart.
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
  parkedSpans,
  parkedValue,
  realValue,
  smLabel,
  smMax,
  smValue,
  usedValue
} from './chart';
import { formatBytes, formatPercent, scaleText } from './format';
import { ISample } from './history';

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

export class UsageChart {
  /**
   * @param kind memory or SM use
   * @param name what the chart is of, in words: `"GPU 0"`, `"Kernel 0123abcd"`
   * @param key its `data-chart`: `"gpu-0"`, `"kernel-<id>"`
   */
  constructor(
    readonly kind: ChartKind,
    private readonly _name: string,
    key: string
  ) {
    this.node = document.createElement('div');
    this.node.className = `hami-chart hami-chart-${kind}`;
    this.node.dataset.chart = key;

    // The SVG's label says it in words: the caption and scale are for the eye only.
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
    this._svg = svg;
    this._title = svgElement('title', '', svg);
    this._spans = svgElement('g', 'hami-chart-spans', svg);
    this._limit = svgElement('path', 'hami-chart-limit', svg);
    if (kind === 'memory') {
      this._real = svgElement('path', 'hami-chart-real', svg);
      this._parked = svgElement('path', 'hami-chart-parked', svg);
    }
    this._line = svgElement('path', 'hami-chart-line', svg);
  }

  readonly node: HTMLDivElement;

  /** Draws `samples` (oldest first) ending at `time.now`. */
  update(samples: readonly ISample[], time: ChartTime): void {
    const frame: IChartFrame = { ...time, width: CHART_WIDTH, height: CHART_HEIGHT };
    const memory = this.kind === 'memory';
    const max = memory ? memoryMax(samples) : smMax(samples);
    const limitOf = memory ? (s: ISample) => s.cap : (s: ISample) => s.share;

    this._svg.dataset.max = String(max);
    const top = scaleText(max, this.kind);
    this._scale.textContent = `0–${top}`;
    this._scale.title = `The chart's scale: 0 at the bottom, ${top} at the top`;
    this._setPath(this._line, linePath(samples, memory ? usedValue : smValue, max, frame));
    this._setPath(this._limit, limitPath(samples, limitOf, max, frame));
    this._limit.dataset.value = String(latestLimit(samples, limitOf));
    if (this._real) {
      this._setPath(this._real, linePath(samples, realValue, max, frame));
    }
    if (this._parked) {
      this._setPath(this._parked, linePath(samples, parkedValue, max, frame));
    }

    // Parked spans: a band behind the lines. Few of them: made anew each time.
    this._spans.textContent = '';
    if (memory) {
      for (const [x0, x1] of parkedSpans(samples, frame)) {
        const rect = svgElement('rect', 'hami-chart-span', this._spans);
        rect.setAttribute('x', String(x0));
        rect.setAttribute('y', '0');
        rect.setAttribute('width', String(Math.max(0.5, x1 - x0)));
        rect.setAttribute('height', String(CHART_HEIGHT));
      }
    }

    const label = memory ? memoryLabel(this._name, samples, time) : smLabel(this._name, samples, time);
    this._svg.setAttribute('aria-label', label);
    this._title.textContent = label;
    this._caption.textContent = this._captionText(samples);
  }

  /** The caption's few words: `"memory 864 MiB"`, `"memory parked"`, `"SM 3 %"`. */
  private _captionText(samples: readonly ISample[]): string {
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

  private _setPath(path: SVGPathElement, d: string): void {
    // An empty `d` is no error, but nothing to draw either: leave it out.
    if (d === '') {
      path.removeAttribute('d');
    } else {
      path.setAttribute('d', d);
    }
  }

  private _caption: HTMLSpanElement;
  private _scale: HTMLSpanElement;
  private _svg: SVGSVGElement;
  private _title: SVGTitleElement;
  private _spans: SVGGElement;
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

  update(samples: readonly ISample[], time: ChartTime): void {
    this.memory.update(samples, time);
    this.sm.update(samples, time);
  }
}

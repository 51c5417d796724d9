/**
 * The right-side panel: the current kernel's slice, its GPUs, and every kernel
 * in it with its GPU memory and SM use, biggest first, and where a kernel's
 * memory is parked in host memory, how much and what its resume waits for.
 * A kernel's note says why it was parked ("parked to make room for another
 * user's work") and what it waits for ("waiting for 8.0 GiB of GPU room since
 * 14:02"); a GPU's line, its guarantee where that is below the cap.
 * Kernels of this server get buttons to park or resume them (whichever
 * applies) and to interrupt, restart or shut them down. Each GPU and each
 * kernel has two small live charts of the last minutes (the setting
 * historyMinutes), memory against the cap and SM use against the share
 * (chartview.ts), from the model's history.
 *
 * Stable hooks for browser tests: the panel's id `hami-slice-panel`, a
 * kernel's `tbody.hami-kernel[data-kernel-id]` with its row
 * `.hami-kernel-row[data-kernel-id]` (with `data-park-state`) and its charts'
 * row `.hami-kernel-charts`; a GPU's `.hami-panel-gpu[data-gpu]` with its line
 * `.hami-panel-gpu-text`; the charts' legend `.hami-chart-legend` (an entry
 * `.hami-legend-limit|parked|real` is shown only while a chart draws it); the charts
 * themselves as chartview.ts says. The rows' park line
 * `.hami-kernel-park`, buttons `.hami-kernel-park-button`,
 * `.hami-kernel-resume-button`, `.hami-kernel-interrupt`,
 * `.hami-kernel-restart`, `.hami-kernel-shutdown`; the outcome of a park or
 * resume `.hami-panel-notice` (`.hami-panel-notice-error` when it failed); the
 * guard's notice `.hami-panel-guard` (a line per GPU it sees over its cap), the
 * processes of the slice the guard parked, with its reason (`.hami-panel-guard-parked`),
 * the GPUs held over a cap lowered since (`.hami-panel-held`: "over its new … cap
 * since 14:02, held before the change"), and
 * such a GPU's line `.hami-panel-gpu.hami-guard-over`. The GPU lines carry the
 * guard's real figure beside the reported one where they differ.
 *
 * A kernel is named by its notebook (`.hami-kernel-name`, the kernel id in its
 * tooltip), as JupyterLab's Running panel names it. Each GPU of the slice is
 * shown as a whole too (`.hami-panel-whole[data-gpu]`: its line
 * `.hami-panel-whole-text`, who holds its memory `.hami-panel-whole-holders`,
 * and four charts: utilization, memory, power, temperature; chartview.ts),
 * from NVML through the server, so a user sees whether the GPU is busy.
 *
 * The panel fits any window from 320 px: it is no wider than JupyterLab's own
 * side panels, and its rows wrap between their parts (style/base.css).
 */

import {
  closeIcon,
  LabIcon,
  pauseIcon,
  refreshIcon,
  runIcon,
  stopIcon
} from '@jupyterlab/ui-components';
import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import { parkKernel, resumeKernel } from './api';
import { formatWindow, ILegendEntries, legendEntries } from './chart';
import { ChartPair, ChartTime, WholeCharts } from './chartview';
import {
  formatBytes,
  formatPercent,
  GUARD_OVER_CLASS,
  gpuGuardOver,
  gpuLevel,
  gpuText,
  guardOverLines,
  kernelMemoryView,
  kernelName,
  kernelTitle,
  guardParkedLines,
  guaranteeText,
  heldLines,
  kernelNoteText,
  LENT_TEXT,
  LEVEL_CLASSES,
  levelClass,
  memoryFraction,
  memoryHeadline,
  panelHeadline,
  PARK_CLASSES,
  ParkAction,
  parkAction,
  parkErrorText,
  parkInfo,
  parkResultText,
  resumeResultText,
  sortKernels,
  statusParkClass,
  wholeGpuHolders,
  wholeGpuText,
  wholeGpuTitle
} from './format';
import { gpuKey } from './history';
import { gpuIcon } from './icon';
import { SliceModel } from './model';
import { IGpuStatus, ISliceKernel, IWholeGpu } from './types';

export const PANEL_ID = 'hami-slice-panel';

/** The actions the plugin carries out (onAction); parking and resuming the panel does itself. */
export type KernelAction = 'interrupt' | 'restart' | 'shutdown';

type RowAction = KernelAction | ParkAction;

/** A row's buttons, in this order; of park and resume at most one is shown (parkAction). */
const ACTIONS: ReadonlyArray<{ action: RowAction; cls: string; label: string; icon: LabIcon }> = [
  {
    action: 'park',
    cls: 'hami-kernel-park-button',
    label: 'Park the kernel: move its GPU memory to host memory until its next cell',
    icon: pauseIcon
  },
  {
    action: 'resume',
    cls: 'hami-kernel-resume-button',
    label: 'Resume the kernel: bring its memory back to the GPU now',
    icon: runIcon
  },
  { action: 'interrupt', cls: 'hami-kernel-interrupt', label: 'Interrupt the kernel', icon: stopIcon },
  { action: 'restart', cls: 'hami-kernel-restart', label: 'Restart the kernel', icon: refreshIcon },
  { action: 'shutdown', cls: 'hami-kernel-shutdown', label: 'Shut down the kernel', icon: closeIcon }
];

/** How long the notice of a park or resume that worked stays (one that failed stays until dismissed). */
const NOTICE_MS = 10_000;

/** The kernels' table's columns: heading and class; a kernel's charts span them all. */
const COLUMNS: ReadonlyArray<[string, string]> = [
  ['Kernel', 'hami-col-kernel'],
  ['Memory', 'hami-col-memory'],
  ['SM', 'hami-col-sm'],
  ['', 'hami-col-actions']
];

/**
 * The DOM of one kernel, kept across refreshes (a click is never lost to a
 * re-render): its own tbody with its row and the row of its charts.
 */
interface IRow {
  body: HTMLTableSectionElement;
  row: HTMLTableRowElement;
  charts: ChartPair;
  name: HTMLElement;
  meta: HTMLElement;
  park: HTMLElement;
  memory: HTMLTableCellElement;
  sm: HTMLTableCellElement;
  actions: HTMLTableCellElement;
  buttons: Map<RowAction, HTMLButtonElement>;
  thisServer: boolean | null;
}

/** The DOM of one GPU's line and charts, and of the GPU as a whole, kept across refreshes. */
interface IGpuItem {
  item: HTMLLIElement;
  text: HTMLElement;
  charts: ChartPair;
  whole: HTMLElement;
  wholeText: HTMLElement;
  wholeHolders: HTMLElement;
  wholeCharts: WholeCharts;
}

function element<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  className: string,
  parent?: HTMLElement
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  node.className = className;
  if (parent) {
    parent.appendChild(node);
  }
  return node;
}

/**
 * `text` in `node` as parts that never break inside: each part between " · "
 * is a span of its own (`hami-part`, no wrap), the separators between them
 * may break. In a narrow panel a row wraps between its figures, never inside
 * one ("3.5 GiB" stays whole), and nothing is cut. The node's text is `text`.
 */
function setParts(node: HTMLElement, text: string): void {
  if (node.textContent === text) {
    return;
  }
  node.textContent = '';
  text.split(' · ').forEach((part, i) => {
    if (i > 0) {
      node.append(' · ');
    }
    element('span', 'hami-part', node).textContent = part;
  });
}

/**
 * A notebook's path in `node`, free to wrap after each "/" (a <wbr> there), so
 * that "work/analysis.ipynb" in a narrow panel goes "work/" then
 * "analysis.ipynb", not "analysis.ipy" then "nb". The node's text is `path`.
 */
function setPath(node: HTMLElement, path: string): void {
  if (node.textContent === path) {
    return;
  }
  node.textContent = '';
  path.split('/').forEach((part, i, all) => {
    node.append(i < all.length - 1 ? `${part}/` : part);
    if (i < all.length - 1) {
      node.appendChild(document.createElement('wbr'));
    }
  });
}

export class SlicePanel extends Widget {
  constructor(options: SlicePanel.IOptions) {
    super();
    this._model = options.model;
    this._onAction = options.onAction;
    this._onShow = options.onShow;
    this.id = PANEL_ID;
    this.addClass('hami-slice-panel');
    this.title.icon = gpuIcon;
    this.title.caption = 'GPU slice';

    const header = element('div', 'hami-panel-header', this.node);
    element('h2', 'hami-panel-title', header).textContent = 'GPU slice';
    this._sliceName = element('div', 'hami-panel-slice', header);

    this._message = element('div', 'hami-panel-message', this.node);

    this._notice = element('div', 'hami-panel-notice', this.node);
    this._notice.hidden = true;
    this._notice.title = 'Click to dismiss';
    this._notice.setAttribute('role', 'status');
    this._notice.addEventListener('click', this);

    this._guard = element('div', `hami-panel-guard ${GUARD_OVER_CLASS}`, this.node);
    this._guard.hidden = true;
    this._guard.setAttribute('role', 'alert');

    this._guardParked = element('div', 'hami-panel-guard-parked', this.node);
    this._guardParked.hidden = true;
    this._guardParked.setAttribute('role', 'alert');

    this._held = element('div', 'hami-panel-held', this.node);
    this._held.hidden = true;
    this._held.setAttribute('role', 'status');

    this._summary = element('div', 'hami-panel-summary', this.node);
    this._usage = element('div', 'hami-panel-usage', this._summary);
    // While this notebook's kernel is parked the headline says so (as the status
    // bar does) and this line, the slice's own usage.
    this._sliceUsage = element('div', 'hami-panel-slice-usage', this._summary);
    this._sliceUsage.hidden = true;
    const meter = element('div', 'hami-meter', this._summary);
    this._meterFill = element('div', 'hami-meter-fill', meter);
    this._legend = this._createLegend();
    this._summary.appendChild(this._legend);
    this._gpus = element('ul', 'hami-panel-gpus', this._summary);
    this._wholeError = element('div', 'hami-panel-whole-error', this._summary);
    this._wholeError.hidden = true;

    this._table = element('table', 'hami-kernel-table', this.node);
    const headRow = element('tr', '', element('thead', '', this._table));
    for (const [text, cls] of COLUMNS) {
      element('th', cls, headRow).textContent = text;
    }
    // One tbody per kernel follows (its row and its charts' row).
    this._table.addEventListener('click', this);

    this._model.changed.connect(this.render, this);
    this.render();
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._model.changed.disconnect(this.render, this);
    this._table.removeEventListener('click', this);
    this._notice.removeEventListener('click', this);
    this._clearNoticeTimer();
    super.dispose();
  }

  handleEvent(event: Event): void {
    if (event.type !== 'click') {
      return;
    }
    if (event.currentTarget === this._notice) {
      this._setNotice(null);
      return;
    }
    const button = (event.target as HTMLElement).closest<HTMLButtonElement>('button[data-action]');
    const row = button?.closest<HTMLElement>('.hami-kernel-row');
    const kernelId = row?.dataset.kernelId;
    if (!button || !kernelId || button.disabled) {
      return;
    }
    const kernel = this._kernels.get(kernelId);
    if (kernel) {
      void this._run(kernel, button.dataset.action as RowAction);
    }
  }

  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    void this._model.refresh();
    this._onShow?.();
  }

  /** Renders the model now (on each of its `changed`). */
  render(): void {
    const model = this._model;
    const status = model.status;
    const headlineText = panelHeadline(status);

    this._sliceName.textContent = status?.in_slice ? status.slice ?? '' : '';
    this._sliceName.title = status?.in_slice ? status.path ?? '' : '';

    let message = '';
    if (model.kernelId === null) {
      message = 'Open a notebook to see its GPU slice.';
    } else if (status === null) {
      message = model.error !== null ? `Cannot read the slice: ${model.error}` : 'Reading the slice…';
    } else if (!status.in_slice) {
      message = "This notebook's kernel is not in a GPU slice" + (status.reason ? `: ${status.reason}.` : '.');
    } else if (status.error !== undefined) {
      message = status.error;
    } else if (model.error !== null) {
      message = `Not updated: ${model.error}`;
    }
    this._message.textContent = message;
    this._message.hidden = message === '';

    const usable = status !== null && status.in_slice && status.error === undefined;
    const over = guardOverLines(status);
    this._guard.textContent = over.length > 0 ? `Over the memory cap:\n${over.join('\n')}` : '';
    this._guard.hidden = over.length === 0;
    const parkedByGuard = guardParkedLines(status, Date.now() / 1000);
    this._guardParked.textContent =
      parkedByGuard.length > 0 ? `Parked by the guard:\n${parkedByGuard.join('\n')}` : '';
    this._guardParked.hidden = parkedByGuard.length === 0;
    const held = heldLines(status);
    this._held.textContent = held.join('\n');
    this._held.hidden = held.length === 0;
    this._summary.hidden = !usable;
    this._table.hidden = !usable;
    if (!usable || status === null) {
      this._renderGpus([]);
      this._renderKernels([]);
      return;
    }

    const level = model.level ?? 'ok';
    setParts(this._usage, headlineText.text ?? '');
    this._sliceUsage.hidden = headlineText.slice === null;
    setParts(this._sliceUsage, headlineText.slice !== null ? `The slice: ${headlineText.slice}` : '');
    // Parked: the headline in the status bar's neutral look, the meter the slice's level.
    const parkClass = statusParkClass(status);
    this._usage.classList.remove(...LEVEL_CLASSES, ...PARK_CLASSES);
    this._usage.classList.add(parkClass ?? levelClass(level));
    this._meterFill.classList.remove(...LEVEL_CLASSES);
    this._meterFill.classList.add(levelClass(level));
    // The meter is the fullest GPU's, as the text: never a sum of the GPUs' caps.
    const headline = memoryHeadline(status);
    const fraction = memoryFraction(headline?.used ?? 0, headline?.limit ?? 0);
    this._meterFill.parentElement!.hidden = fraction === null;
    this._meterFill.style.width = `${Math.min(100, (fraction ?? 0) * 100).toFixed(1)}%`;

    const gpus = status.gpus ?? [];
    this._renderLegend();
    this._renderGpus(gpus, status.whole_gpus ?? []);
    const wholeError = status.whole_gpus_error;
    this._wholeError.textContent =
      typeof wholeError === 'string' && wholeError !== '' ? `The whole GPU: ${wholeError}` : '';
    this._wholeError.hidden = this._wholeError.textContent === '';
    this._renderKernels(sortKernels(status.kernels ?? []));
  }

  /** The time the charts are drawn at: now, over the history's window. */
  private _chartTime(): ChartTime {
    const model = this._model;
    return { now: model.now(), windowMs: model.history.windowMs, maxGapMs: model.maxGapMs };
  }

  /** The legend of the charts: the window, then what each line is. */
  private _createLegend(): HTMLElement {
    const legend = element('div', 'hami-chart-legend');
    legend.setAttribute('aria-hidden', 'true'); // each chart says it all in its label
    this._legendWindow = element('span', 'hami-legend-window', legend);
    const entries: Array<[keyof ILegendEntries | null, string, string]> = [
      [null, 'hami-legend-line', 'in use'],
      ['limit', 'hami-legend-limit', 'cap / share'],
      ['parked', 'hami-legend-parked', 'parked'],
      ['real', 'hami-legend-real', 'real (guard)']
    ];
    for (const [key, cls, text] of entries) {
      const entry = element('span', `hami-legend-entry ${cls}`, legend);
      element('span', 'hami-legend-swatch', entry);
      entry.append(text);
      if (key !== null) {
        entry.hidden = true;
        this._legendEntries.set(key, entry);
      }
    }
    // The whole GPU's memory chart draws this slice's bytes beside everyone's.
    this._legendSlice = element('span', 'hami-legend-entry hami-legend-slice', legend);
    element('span', 'hami-legend-swatch', this._legendSlice);
    this._legendSlice.append('this slice (whole GPU)');
    this._legendSlice.hidden = true;
    return legend;
  }

  /** The legend's window, and only the entries some chart draws now (legendEntries). */
  private _renderLegend(): void {
    const history = this._model.history;
    this._legendWindow.textContent = `Last ${formatWindow(history.windowMs)}:`;
    const series = [
      ...history.gpuKeys().map(key => history.gpu(key)),
      ...history.kernelIds().map(id => history.kernel(id))
    ];
    const shown = legendEntries(series, this._chartTime());
    for (const [key, entry] of this._legendEntries) {
      entry.hidden = !shown[key];
    }
    this._legendSlice.hidden = (this._model.status?.whole_gpus ?? []).length === 0;
  }

  /** The GPUs' lines and charts, in the order of the answer. */
  private _renderGpus(gpus: readonly IGpuStatus[], wholes: readonly IWholeGpu[] = []): void {
    const model = this._model;
    const time = this._chartTime();
    const seen = new Set<string>();
    gpus.forEach((gpu, position) => {
      const key = gpuKey(gpu);
      seen.add(key);
      let parts = this._gpuItems.get(key);
      if (!parts) {
        const item = element('li', 'hami-panel-gpu');
        item.dataset.gpu = key;
        const text = element('div', 'hami-panel-gpu-text', item);
        const charts = new ChartPair(`GPU ${gpu.index}`, `gpu-${key}`);
        item.appendChild(charts.node);
        // The GPU as a whole, beside the slice's share of it: is it busy?
        const whole = element('div', 'hami-panel-whole', item);
        whole.dataset.gpu = key;
        const wholeText = element('div', 'hami-panel-whole-text', whole);
        const wholeHolders = element('div', 'hami-panel-whole-holders', whole);
        wholeHolders.title =
          "Who holds the GPU's memory: this slice; other slices you may see (an administrator sees " +
          "every user's by name); everything else, one total (other users, processes outside " +
          "slices, the driver)";
        const wholeCharts = new WholeCharts(`GPU ${gpu.index}`, `whole-${key}`);
        whole.appendChild(wholeCharts.node);
        parts = { item, text, charts, whole, wholeText, wholeHolders, wholeCharts };
        this._gpuItems.set(key, parts);
      }
      const whole = wholes.find(w => w.index === gpu.index) ?? null;
      parts.whole.hidden = whole === null;
      if (whole !== null) {
        setParts(parts.wholeText, wholeGpuText(whole));
        parts.wholeText.title = wholeGpuTitle(whole);
        setParts(parts.wholeHolders, wholeGpuHolders(whole));
        parts.wholeCharts.update(model.history.whole(key), time);
      }
      parts.item.classList.remove(...LEVEL_CLASSES);
      parts.item.classList.add(levelClass(gpuLevel(gpu, model.thresholds)));
      parts.item.classList.toggle(GUARD_OVER_CLASS, gpuGuardOver(gpu));
      setParts(parts.text, gpuText(gpu));
      const lent = guaranteeText(gpu) !== null ? `\n${LENT_TEXT}` : '';
      parts.text.title = (gpu.uuid ? `${gpuText(gpu)}\n${gpu.uuid}` : gpuText(gpu)) + lent;
      parts.charts.update(model.history.gpu(key), time);
      if (this._gpus.children[position] !== parts.item) {
        this._gpus.insertBefore(parts.item, this._gpus.children[position] ?? null);
      }
    });
    for (const [key, parts] of this._gpuItems) {
      if (!seen.has(key)) {
        parts.item.remove();
        this._gpuItems.delete(key);
      }
    }
  }

  private _renderKernels(kernels: ISliceKernel[]): void {
    const time = this._chartTime();
    const seen = new Set<string>();
    this._kernels.clear();
    kernels.forEach((kernel, position) => {
      seen.add(kernel.kernel_id);
      this._kernels.set(kernel.kernel_id, kernel);
      let parts = this._rows.get(kernel.kernel_id);
      if (!parts) {
        parts = this._createRow(kernel.kernel_id);
        this._rows.set(kernel.kernel_id, parts);
      }
      this._fillRow(parts, kernel);
      parts.charts.update(this._model.history.kernel(kernel.kernel_id), time);
      // Keep the DOM in the sorted order, moving only kernels out of place.
      const bodies = this._table.tBodies;
      if (bodies[position] !== parts.body) {
        this._table.insertBefore(parts.body, bodies[position] ?? null);
      }
    });
    for (const [id, parts] of this._rows) {
      if (!seen.has(id)) {
        parts.body.remove();
        this._rows.delete(id);
      }
    }
  }

  private _createRow(kernelId: string): IRow {
    const body = element('tbody', 'hami-kernel');
    body.dataset.kernelId = kernelId;
    const row = element('tr', 'hami-kernel-row', body);
    row.dataset.kernelId = kernelId;
    const cell = element('td', 'hami-kernel-cell-name', row);
    const name = element('div', 'hami-kernel-name', cell);
    const meta = element('div', 'hami-kernel-meta', cell);
    const park = element('div', 'hami-kernel-park', cell);
    park.hidden = true;
    const memory = element('td', 'hami-kernel-memory', row);
    const sm = element('td', 'hami-kernel-sm', row);
    const actions = element('td', 'hami-kernel-actions', row);
    const chartCell = element('td', 'hami-kernel-charts-cell', element('tr', 'hami-kernel-charts', body));
    chartCell.colSpan = COLUMNS.length;
    const charts = new ChartPair(`Kernel ${kernelId.slice(0, 8)}`, `kernel-${kernelId}`);
    chartCell.appendChild(charts.node);
    return { body, row, charts, name, meta, park, memory, sm, actions, buttons: new Map(), thisServer: null };
  }

  private _fillRow(parts: IRow, kernel: ISliceKernel): void {
    const current = kernel.kernel_id === this._model.kernelId;
    parts.row.classList.toggle('hami-kernel-current', current);
    parts.row.classList.toggle('hami-kernel-other-server', !kernel.this_server);

    // Named by its notebook, as JupyterLab's Running panel names it; the id in the tooltip.
    const name = kernelName(kernel);
    setPath(parts.name, name);
    parts.name.title = kernelTitle(kernel);
    parts.charts.name = `Kernel ${name}`;
    const meta = [
      current ? 'this notebook' : undefined,
      kernel.kernelspec,
      kernel.user,
      kernel.pid ? `pid ${kernel.pid}` : undefined
    ];
    if (!kernel.this_server) {
      meta.push('another server');
    }
    setParts(parts.meta, meta.filter(Boolean).join(' · '));
    parts.meta.title = parts.meta.textContent ?? '';

    const state = parkInfo(kernel).state;
    const parkText = kernelNoteText(kernel);
    parts.row.dataset.parkState = state;
    parts.row.classList.toggle('hami-kernel-parked', state !== 'running');
    parts.park.textContent = parkText ?? '';
    parts.park.hidden = parkText === null;

    parts.memory.textContent = formatBytes(kernel.memory_used ?? 0);
    // Its own level against the cap of the GPU it uses (not its rank: the
    // biggest kernel at 48 % is no warning), and that GPU named among several.
    const view = kernelMemoryView(kernel, this._model.status);
    parts.memory.classList.remove(...LEVEL_CLASSES);
    parts.memory.classList.add(levelClass(view.level));
    parts.memory.title = view.title;
    parts.sm.textContent = formatPercent(kernel.sm_util ?? 0);

    const thisServer = kernel.this_server === true;
    if (parts.thisServer !== thisServer) {
      parts.thisServer = thisServer;
      parts.actions.textContent = '';
      parts.buttons.clear();
      if (thisServer) {
        for (const { action, cls, label, icon } of ACTIONS) {
          const button = element('button', `hami-kernel-action ${cls}`, parts.actions);
          button.type = 'button';
          button.dataset.action = action;
          button.title = label;
          button.setAttribute('aria-label', `${label} (${name})`);
          button.appendChild(icon.element({ tag: 'span', elementPosition: 'center', height: '16px', width: '16px' }));
          parts.buttons.set(action, button);
        }
      }
    }
    const busy = this._pending.has(kernel.kernel_id);
    // While a park or resume runs its button stays (disabled) even if the
    // state the poll reports has already moved on.
    const running = this._pending.get(kernel.kernel_id);
    const offered = running === 'park' || running === 'resume' ? running : parkAction(kernel);
    for (const [action, button] of parts.buttons) {
      button.disabled = busy;
      if (action === 'park' || action === 'resume') {
        button.hidden = action !== offered;
      }
    }
  }

  private async _run(kernel: ISliceKernel, action: RowAction): Promise<void> {
    const id = kernel.kernel_id;
    this._pending.set(id, action);
    if (action === 'park' || action === 'resume') {
      this._setNotice(null);
    }
    this.render();
    const name = kernelName(kernel);
    try {
      if (action === 'park') {
        this._setNotice(parkResultText(await parkKernel(this._model.serverSettings, id), name), false);
      } else if (action === 'resume') {
        this._setNotice(resumeResultText(await resumeKernel(this._model.serverSettings, id), name), false);
      } else {
        await this._onAction(kernel, action);
      }
    } catch (reason) {
      if (action === 'park' || action === 'resume') {
        const message = reason instanceof Error ? reason.message : String(reason);
        this._setNotice(parkErrorText(action, id, message, name), true);
      } else {
        console.error(`hami-jupyter: ${action} of kernel ${id} failed`, reason);
      }
    } finally {
      this._pending.delete(id);
      this.render();
      void this._model.refresh();
    }
  }

  /** Shows the outcome of a park or resume (`null`: hides it); one that worked goes after NOTICE_MS. */
  private _setNotice(text: string | null, error = false): void {
    this._clearNoticeTimer();
    this._notice.textContent = text ?? '';
    this._notice.hidden = text === null;
    this._notice.classList.toggle('hami-panel-notice-error', text !== null && error);
    if (text !== null && !error) {
      this._noticeTimer = window.setTimeout(() => this._setNotice(null), NOTICE_MS);
    }
  }

  private _clearNoticeTimer(): void {
    if (this._noticeTimer !== null) {
      window.clearTimeout(this._noticeTimer);
      this._noticeTimer = null;
    }
  }

  private _model: SliceModel;
  private _onAction: SlicePanel.ActionHandler;
  private _onShow?: () => void;
  private _sliceName: HTMLElement;
  private _message: HTMLElement;
  private _notice: HTMLElement;
  private _noticeTimer: number | null = null;
  private _guard: HTMLElement;
  private _guardParked: HTMLElement;
  private _held: HTMLElement;
  private _summary: HTMLElement;
  private _usage: HTMLElement;
  private _sliceUsage: HTMLElement;
  private _meterFill: HTMLElement;
  private _legend: HTMLElement;
  private _legendWindow!: HTMLElement;
  private _legendEntries = new Map<keyof ILegendEntries, HTMLElement>();
  private _legendSlice!: HTMLElement;
  private _gpus: HTMLUListElement;
  private _wholeError: HTMLElement;
  private _gpuItems = new Map<string, IGpuItem>();
  private _table: HTMLTableElement;
  private _rows = new Map<string, IRow>();
  private _kernels = new Map<string, ISliceKernel>();
  /** The kernels with an action under way, and which. */
  private _pending = new Map<string, RowAction>();
}

export namespace SlicePanel {
  /** Carries out an action on a kernel (asking the user first where it destroys state). */
  export type ActionHandler = (kernel: ISliceKernel, action: KernelAction) => Promise<void>;

  export interface IOptions {
    model: SliceModel;
    onAction: ActionHandler;
    /** Called each time the panel is shown (the plugin makes room for it in a narrow window). */
    onShow?: () => void;
  }
}

/**
 * The right-side panel: the current kernel's slice, its GPUs, and every kernel
 * in it with its GPU memory and SM use, biggest first. Kernels of this server
 * get buttons to interrupt, restart or shut them down.
 *
 * Stable hooks for browser tests: the panel's id `hami-slice-panel`, rows
 * `.hami-kernel-row[data-kernel-id]`, buttons `.hami-kernel-interrupt`,
 * `.hami-kernel-restart`, `.hami-kernel-shutdown`.
 */

import { closeIcon, LabIcon, refreshIcon, stopIcon } from '@jupyterlab/ui-components';
import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import {
  formatBytes,
  formatPercent,
  gpuLevel,
  gpuText,
  LEVEL_CLASSES,
  levelClass,
  memoryFraction,
  shortId,
  sortKernels,
  statusText
} from './format';
import { gpuIcon } from './icon';
import { SliceModel } from './model';
import { ISliceKernel } from './types';

export const PANEL_ID = 'hami-slice-panel';

export type KernelAction = 'interrupt' | 'restart' | 'shutdown';

const ACTIONS: ReadonlyArray<{ action: KernelAction; label: string; icon: LabIcon }> = [
  { action: 'interrupt', label: 'Interrupt the kernel', icon: stopIcon },
  { action: 'restart', label: 'Restart the kernel', icon: refreshIcon },
  { action: 'shutdown', label: 'Shut down the kernel', icon: closeIcon }
];

/** The DOM of one kernel's row, kept across refreshes (a click is never lost to a re-render). */
interface IRow {
  row: HTMLTableRowElement;
  name: HTMLElement;
  meta: HTMLElement;
  memory: HTMLTableCellElement;
  sm: HTMLTableCellElement;
  actions: HTMLTableCellElement;
  buttons: Map<KernelAction, HTMLButtonElement>;
  thisServer: boolean | null;
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

export class SlicePanel extends Widget {
  constructor(options: SlicePanel.IOptions) {
    super();
    this._model = options.model;
    this._onAction = options.onAction;
    this.id = PANEL_ID;
    this.addClass('hami-slice-panel');
    this.title.icon = gpuIcon;
    this.title.caption = 'GPU slice';

    const header = element('div', 'hami-panel-header', this.node);
    element('h2', 'hami-panel-title', header).textContent = 'GPU slice';
    this._sliceName = element('div', 'hami-panel-slice', header);

    this._message = element('div', 'hami-panel-message', this.node);

    this._summary = element('div', 'hami-panel-summary', this.node);
    this._usage = element('div', 'hami-panel-usage', this._summary);
    const meter = element('div', 'hami-meter', this._summary);
    this._meterFill = element('div', 'hami-meter-fill', meter);
    this._gpus = element('ul', 'hami-panel-gpus', this._summary);

    this._table = element('table', 'hami-kernel-table', this.node);
    const headRow = element('tr', '', element('thead', '', this._table));
    for (const [text, cls] of [
      ['Kernel', 'hami-col-kernel'],
      ['Memory', 'hami-col-memory'],
      ['SM', 'hami-col-sm'],
      ['', 'hami-col-actions']
    ]) {
      element('th', cls, headRow).textContent = text;
    }
    this._tbody = element('tbody', '', this._table);
    this._tbody.addEventListener('click', this);

    this._model.changed.connect(this.render, this);
    this.render();
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._model.changed.disconnect(this.render, this);
    this._tbody.removeEventListener('click', this);
    super.dispose();
  }

  handleEvent(event: Event): void {
    if (event.type !== 'click') {
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
      void this._run(kernel, button.dataset.action as KernelAction);
    }
  }

  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    void this._model.refresh();
  }

  /** Renders the model now (on each of its `changed`). */
  render(): void {
    const model = this._model;
    const status = model.status;
    const text = statusText(status);

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
    this._summary.hidden = !usable;
    this._table.hidden = !usable;
    if (!usable || status === null) {
      this._renderKernels([]);
      return;
    }

    const level = model.level ?? 'ok';
    this._usage.textContent = text ?? '';
    for (const node of [this._usage, this._meterFill]) {
      node.classList.remove(...LEVEL_CLASSES);
      node.classList.add(levelClass(level));
    }
    const fraction = memoryFraction(status.memory_used ?? 0, status.memory_limit ?? 0);
    this._meterFill.parentElement!.hidden = fraction === null;
    this._meterFill.style.width = `${Math.min(100, (fraction ?? 0) * 100).toFixed(1)}%`;

    this._gpus.textContent = '';
    for (const gpu of status.gpus ?? []) {
      const item = element('li', `hami-panel-gpu ${levelClass(gpuLevel(gpu, model.thresholds))}`, this._gpus);
      item.textContent = gpuText(gpu);
      if (gpu.uuid) {
        item.title = gpu.uuid;
      }
    }
    this._renderKernels(sortKernels(status.kernels ?? []));
  }

  private _renderKernels(kernels: ISliceKernel[]): void {
    const status = this._model.status;
    const limit = status?.memory_limit ?? 0;
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
      this._fillRow(parts, kernel, position === 0 && kernels.length > 1, limit);
      // Keep the DOM in the sorted order, moving only rows out of place.
      if (this._tbody.children[position] !== parts.row) {
        this._tbody.insertBefore(parts.row, this._tbody.children[position] ?? null);
      }
    });
    for (const [id, parts] of this._rows) {
      if (!seen.has(id)) {
        parts.row.remove();
        this._rows.delete(id);
      }
    }
  }

  private _createRow(kernelId: string): IRow {
    const row = element('tr', 'hami-kernel-row');
    row.dataset.kernelId = kernelId;
    const cell = element('td', 'hami-kernel-cell-name', row);
    const name = element('div', 'hami-kernel-name', cell);
    const meta = element('div', 'hami-kernel-meta', cell);
    const memory = element('td', 'hami-kernel-memory', row);
    const sm = element('td', 'hami-kernel-sm', row);
    const actions = element('td', 'hami-kernel-actions', row);
    return { row, name, meta, memory, sm, actions, buttons: new Map(), thisServer: null };
  }

  private _fillRow(parts: IRow, kernel: ISliceKernel, top: boolean, sliceLimit: number): void {
    const current = kernel.kernel_id === this._model.kernelId;
    parts.row.classList.toggle('hami-kernel-current', current);
    parts.row.classList.toggle('hami-kernel-top', top && (kernel.memory_used ?? 0) > 0);
    parts.row.classList.toggle('hami-kernel-other-server', !kernel.this_server);

    parts.name.textContent = shortId(kernel.kernel_id);
    parts.name.title = kernel.kernel_id;
    const meta = [
      current ? 'this notebook' : undefined,
      kernel.kernelspec,
      kernel.user,
      kernel.pid ? `pid ${kernel.pid}` : undefined
    ];
    if (!kernel.this_server) {
      meta.push('another server');
    }
    parts.meta.textContent = meta.filter(Boolean).join(' · ');

    parts.memory.textContent = formatBytes(kernel.memory_used ?? 0);
    const fraction = memoryFraction(kernel.memory_used ?? 0, sliceLimit);
    parts.memory.title = fraction === null ? '' : `${formatPercent(fraction * 100)} of the slice's cap`;
    parts.sm.textContent = formatPercent(kernel.sm_util ?? 0);

    const thisServer = kernel.this_server === true;
    if (parts.thisServer !== thisServer) {
      parts.thisServer = thisServer;
      parts.actions.textContent = '';
      parts.buttons.clear();
      if (thisServer) {
        for (const { action, label, icon } of ACTIONS) {
          const button = element('button', `hami-kernel-action hami-kernel-${action}`, parts.actions);
          button.type = 'button';
          button.dataset.action = action;
          button.title = label;
          button.setAttribute('aria-label', label);
          button.appendChild(icon.element({ tag: 'span', elementPosition: 'center', height: '16px', width: '16px' }));
          parts.buttons.set(action, button);
        }
      }
    }
    const busy = this._pending.has(kernel.kernel_id);
    for (const button of parts.buttons.values()) {
      button.disabled = busy;
    }
  }

  private async _run(kernel: ISliceKernel, action: KernelAction): Promise<void> {
    const id = kernel.kernel_id;
    this._pending.add(id);
    this.render();
    try {
      await this._onAction(kernel, action);
    } catch (reason) {
      console.error(`hami-jupyter: ${action} of kernel ${id} failed`, reason);
    } finally {
      this._pending.delete(id);
      this.render();
      void this._model.refresh();
    }
  }

  private _model: SliceModel;
  private _onAction: SlicePanel.ActionHandler;
  private _sliceName: HTMLElement;
  private _message: HTMLElement;
  private _summary: HTMLElement;
  private _usage: HTMLElement;
  private _meterFill: HTMLElement;
  private _gpus: HTMLUListElement;
  private _table: HTMLTableElement;
  private _tbody: HTMLTableSectionElement;
  private _rows = new Map<string, IRow>();
  private _kernels = new Map<string, ISliceKernel>();
  private _pending = new Set<string>();
}

export namespace SlicePanel {
  /** Carries out an action on a kernel (asking the user first where it destroys state). */
  export type ActionHandler = (kernel: ISliceKernel, action: KernelAction) => Promise<void>;

  export interface IOptions {
    model: SliceModel;
    onAction: ActionHandler;
  }
}

/**
 * The status bar item: "vGPU 1.2 / 4.0 GiB · SM 23 % / 25 %" for the current
 * kernel's slice, coloured by its memory level; "vGPU parked · 8.0 GiB in
 * host memory", "vGPU parking…" or "vGPU resuming…" in a neutral look while
 * the kernel's memory is parked or on its way. While the guard sees a GPU of
 * the slice over its cap it gets the class `hami-guard-over` too (a look of
 * its own), and its tooltip says what the guard sees. The status bar hides it
 * for a kernel outside a slice (see `isActive` where it is registered).
 */

import { Widget } from '@lumino/widgets';

import {
  GUARD_OVER_CLASS,
  LEVEL_CLASSES,
  levelClass,
  PARK_CLASSES,
  parkInfo,
  statusGuardClass,
  statusParkClass,
  statusText,
  tooltipText
} from './format';
import { SliceModel } from './model';

/**
 * The item's class; with one of `hami-level-ok|warning|critical` while shown
 * for a running kernel, or `hami-parked` (parked, parking) or `hami-resuming`
 * instead while its memory is parked or on its way; and `hami-guard-over`
 * beside either while the guard sees the slice over its cap.
 */
export const STATUS_CLASS = 'hami-statusbar';
/** Added while the last poll failed: the numbers are the previous ones. */
export const STALE_CLASS = 'hami-stale';

export class SliceStatusItem extends Widget {
  constructor(options: SliceStatusItem.IOptions) {
    super({ node: document.createElement('div') });
    this._model = options.model;
    this._onClick = options.onClick;
    this.addClass(STATUS_CLASS);
    this.addClass('jp-StatusBar-GroupItem');
    this._text = document.createElement('span');
    this._text.className = 'hami-statusbar-text jp-StatusBar-TextItem';
    // The memory and the rest apart: a window under 630 px shows the memory
    // alone, so that the item fits beside JupyterLab's own (style/base.css).
    this._memory = document.createElement('span');
    this._memory.className = 'hami-statusbar-memory';
    this._rest = document.createElement('span');
    this._rest.className = 'hami-statusbar-rest';
    this._text.append(this._memory, this._rest);
    this.node.appendChild(this._text);
    this.node.setAttribute('role', 'button');
    this._model.changed.connect(this.render, this);
    this.render();
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._model.changed.disconnect(this.render, this);
    super.dispose();
  }

  handleEvent(event: Event): void {
    if (event.type === 'click' && this._onClick) {
      this._onClick();
    }
  }

  protected onAfterAttach(): void {
    this.node.addEventListener('click', this);
  }

  protected onBeforeDetach(): void {
    this.node.removeEventListener('click', this);
  }

  /** Renders the model now (on each of its `changed`). */
  render(): void {
    const model = this._model;
    const status = model.status;
    const text = statusText(status) ?? '';
    const cut = text.indexOf(' · SM ');
    this._memory.textContent = cut >= 0 ? text.slice(0, cut) : text;
    this._rest.textContent = cut >= 0 ? text.slice(cut) : '';
    for (const cls of [...LEVEL_CLASSES, ...PARK_CLASSES]) {
      this.removeClass(cls);
    }
    const level = model.level;
    const parkClass = statusParkClass(status);
    if (parkClass !== null) {
      // The text is about the kernel's parked memory, not the slice's level.
      this.addClass(parkClass);
    } else if (text !== '' && level !== null) {
      this.addClass(levelClass(level));
    }
    // The guard's verdict is its own class: the memory level is what the slice
    // counts, the guard reads what the GPU really holds.
    const guardClass = statusGuardClass(status);
    this.toggleClass(GUARD_OVER_CLASS, guardClass !== null && text !== '');
    if (guardClass !== null) {
      this.node.dataset.guard = 'over';
    } else {
      delete this.node.dataset.guard;
    }
    this.toggleClass(STALE_CLASS, model.error !== null && text !== '');
    let title = tooltipText(status);
    if (model.error !== null) {
      title = `${title}\n(not updated: ${model.error})`;
    }
    this.node.title = title;
    if (level !== null) {
      this.node.dataset.level = level;
    } else {
      delete this.node.dataset.level;
    }
    if (parkClass !== null) {
      this.node.dataset.park = parkInfo(status?.kernel).state;
    } else {
      delete this.node.dataset.park;
    }
  }

  private _model: SliceModel;
  private _onClick?: () => void;
  private _text: HTMLSpanElement;
  private _memory: HTMLSpanElement;
  private _rest: HTMLSpanElement;
}

export namespace SliceStatusItem {
  export interface IOptions {
    model: SliceModel;
    /** What a click does (opens the slice panel). */
    onClick?: () => void;
  }
}

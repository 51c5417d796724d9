/**
 * What the status bar item and the slice panel show: the answer of
 * `GET {baseUrl}hami/v1/kernels/<id>` for the current notebook's kernel,
 * polled at the settings' refresh rate while the page is visible, and the
 * last minutes of those answers for the panel's charts (history.ts: a gap
 * where a poll got no answer). When a slice first shows, the minutes the
 * server kept of it before this page (`.../history`) go in front, so the
 * charts do not start over at a page load.
 */

import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';
import { IDisposable } from '@lumino/disposable';
import { IPoll, Poll } from '@lumino/polling';
import { ISignal, Signal } from '@lumino/signaling';

import { fetchHistory, KERNEL_API_PATH } from './api';
import {
  DEFAULT_REFRESH_RATE,
  MIN_REFRESH_RATE,
  normalizeRefreshRate,
  parseKernelStatus,
  sliceLevel,
  statusThresholds
} from './format';
import { DEFAULT_HISTORY_MINUTES, normalizeHistoryMinutes, SliceHistory } from './history';
import { IKernelSliceStatus, IThresholds, Level } from './types';

export { KERNEL_API_PATH };

/** A failed poll backs off up to this many refresh intervals. */
const MAX_BACKOFF_FACTOR = 10;

/**
 * Two readings more than this many refresh intervals apart are not joined by
 * the charts' lines: polls were missed (the page was hidden, the poll stood by).
 */
const GAP_INTERVALS = 3;

const MINUTE_MS = 60_000;

export class SliceModel implements IDisposable {
  constructor(options: SliceModel.IOptions = {}) {
    this._serverSettings = options.serverSettings ?? ServerConnection.makeSettings();
    this._refreshRate = normalizeRefreshRate(options.refreshRate ?? DEFAULT_REFRESH_RATE);
    this._now = options.now ?? Date.now;
    this._historyMinutes = normalizeHistoryMinutes(options.historyMinutes ?? DEFAULT_HISTORY_MINUTES);
    this._history = new SliceHistory({
      windowMs: this._historyMinutes * MINUTE_MS,
      minIntervalMs: MIN_REFRESH_RATE
    });
    this._poll = new Poll({
      factory: () => this._fetch(),
      frequency: this._frequency(),
      name: 'hami-jupyter:slice',
      // Nothing to ask without a kernel; nothing to show on a hidden page.
      standby: () => this._kernelId === null || 'when-hidden'
    });
  }

  /** Emitted whenever the status (and with it the thresholds) or the error change. */
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  get serverSettings(): ServerConnection.ISettings {
    return this._serverSettings;
  }

  /** The kernel whose slice is shown; `null`: none (no notebook, no kernel). */
  get kernelId(): string | null {
    return this._kernelId;
  }

  set kernelId(id: string | null) {
    if (id === this._kernelId) {
      return;
    }
    this._kernelId = id;
    this._status = null;
    this._error = null;
    this._changed.emit();
    if (id !== null) {
      void this.refresh();
    }
  }

  /** The last answer for the current kernel; `null` before the first one. */
  get status(): IKernelSliceStatus | null {
    return this._status;
  }

  /** Why the last poll failed (network, HTTP); `null` when it worked. */
  get error(): string | null {
    return this._error;
  }

  /** Whether the current kernel is in a slice, i.e. whether there is anything to show. */
  get inSlice(): boolean {
    return this._status !== null && this._status.in_slice;
  }

  /** The level of the current slice with the thresholds of its status; `null` outside a slice. */
  get level(): Level | null {
    return sliceLevel(this._status, this.thresholds);
  }

  /**
   * The thresholds the server sent with the last status (statusThresholds):
   * the defaults outside a slice, for an unreadable slice file, before the
   * first answer, or when the server sends no usable ones. While a poll fails
   * the last status stays shown, and so do its thresholds.
   */
  get thresholds(): IThresholds {
    return statusThresholds(this._status);
  }

  /** Milliseconds between two polls. */
  get refreshRate(): number {
    return this._refreshRate;
  }

  set refreshRate(ms: number) {
    const rate = normalizeRefreshRate(ms);
    if (rate === this._refreshRate) {
      return;
    }
    this._refreshRate = rate;
    this._poll.frequency = this._frequency();
  }

  /**
   * The last minutes of the slice (the current kernel's), one series per GPU
   * and per kernel, for the charts. It belongs to the slice: switching to
   * another notebook of the same slice keeps it.
   */
  get history(): SliceHistory {
    return this._history;
  }

  /** How many minutes the history keeps (the chart history setting). */
  get historyMinutes(): number {
    return this._historyMinutes;
  }

  set historyMinutes(minutes: number) {
    const value = normalizeHistoryMinutes(minutes);
    if (value === this._historyMinutes) {
      return;
    }
    this._historyMinutes = value;
    this._history.windowMs = value * MINUTE_MS;
    this._changed.emit();
  }

  /**
   * Readings further apart than this (ms) are not joined in the charts: polls
   * were missed. The server's samples (seeded) are as far apart as its interval.
   */
  get maxGapMs(): number {
    return GAP_INTERVALS * Math.max(this._refreshRate, this._serverIntervalMs);
  }

  /** The clock the history's samples are taken with (ms since the epoch); the charts end at it. */
  now(): number {
    return this._now();
  }

  /** Asks the server now (after a kernel action, on showing the panel); `changed` tells the answer. */
  async refresh(): Promise<void> {
    if (this._kernelId === null || this.isDisposed) {
      return;
    }
    await this._poll.refresh();
  }

  get isDisposed(): boolean {
    return this._poll.isDisposed;
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._poll.dispose();
    Signal.clearData(this);
  }

  private _frequency(): IPoll.Frequency {
    return {
      interval: this._refreshRate,
      backoff: true,
      max: this._refreshRate * MAX_BACKOFF_FACTOR
    };
  }

  private async _fetch(): Promise<void> {
    const id = this._kernelId;
    if (id === null) {
      return;
    }
    const settings = this._serverSettings;
    const url = URLExt.join(settings.baseUrl, KERNEL_API_PATH, encodeURIComponent(id));
    let status: IKernelSliceStatus | null;
    try {
      const response = await ServerConnection.makeRequest(url, {}, settings);
      if (response.status === 404) {
        // A kernel the server does not know (shut down meanwhile), or a server
        // without the hami-jupyter server extension: nothing to show.
        status = { kernel_id: id, in_slice: false, reason: 'unknown to the server' };
      } else if (!response.ok) {
        throw new ServerConnection.ResponseError(response);
      } else {
        status = parseKernelStatus(await response.json());
        if (status === null) {
          throw new Error('the server answered something that is not a kernel status');
        }
      }
    } catch (reason) {
      if (id === this._kernelId) {
        this._error = reason instanceof Error ? reason.message : String(reason);
        // The charts break their lines here: the server said nothing.
        this._history.recordGap(this._now());
        this._changed.emit();
      }
      throw reason; // the poll backs off
    }
    if (id !== this._kernelId) {
      return; // the current kernel changed while we asked
    }
    this._status = status;
    this._error = null;
    this._history.record(status, this._now());
    const slice = this._history.slice;
    if (slice !== null && slice !== this._seeded && status.error === undefined) {
      this._seeded = slice;
      void this._seed(id, slice);
    }
    this._changed.emit();
  }

  /** The server's history of `slice` before this page, in front of the polls' (once per slice). */
  private async _seed(kernelId: string, slice: string): Promise<void> {
    try {
      const kept = await fetchHistory(this._serverSettings, kernelId, this._historyMinutes);
      if (kept.interval_s > 0) {
        this._serverIntervalMs = kept.interval_s * 1000;
      }
      if (kept.path === slice && this._history.seed(slice, kept) > 0) {
        this._changed.emit();
      }
    } catch {
      // A server without the history (an older one): the charts start with this page.
    }
  }

  private _serverSettings: ServerConnection.ISettings;
  private _kernelId: string | null = null;
  private _status: IKernelSliceStatus | null = null;
  private _error: string | null = null;
  private _refreshRate: number;
  private _historyMinutes: number;
  private _history: SliceHistory;
  /** The slice whose server history was asked for already. */
  private _seeded: string | null = null;
  /** How far apart the server's own samples are (its history interval), ms. */
  private _serverIntervalMs = 0;
  private _now: () => number;
  private _poll: Poll;
  private _changed = new Signal<this, void>(this);
}

export namespace SliceModel {
  export interface IOptions {
    serverSettings?: ServerConnection.ISettings;
    refreshRate?: number;
    /** Minutes of history the charts show (the setting `historyMinutes`); 5 by default. */
    historyMinutes?: number;
    /** The clock, ms since the epoch; `Date.now` by default (tests pass their own). */
    now?: () => number;
  }
}

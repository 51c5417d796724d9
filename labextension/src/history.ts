/**
 * The last minutes of a slice, what the panel's charts draw: one ring buffer of
 * samples per GPU of the slice and one per kernel, filled from the model's
 * polls, and seeded, when a page first shows the slice, with the minutes the
 * server kept before it (`GET hami/v1/kernels/<id>/history`, samples of the
 * same shape), so a page load does not start the charts over. A poll the
 * server did not answer is a gap sample in every series, so the charts break
 * their lines there instead of joining across it. No DOM and no JupyterLab
 * here, so the unit tests run in plain Node.
 */

import { kernelSplit, memoryHeadline } from './format';
import { IGpuStatus, IKernelSliceStatus, ISliceKernel, IWholeGpu, ParkState } from './types';

/**
 * A fixed number of items, oldest first; pushing onto a full buffer drops the
 * oldest. Memory stays bounded whatever the poll does.
 */
export class RingBuffer<T> {
  constructor(capacity: number) {
    this._capacity = RingBuffer._checked(capacity);
  }

  /** How many items it holds at most. */
  get capacity(): number {
    return this._capacity;
  }

  /** How many items it holds now. */
  get length(): number {
    return this._length;
  }

  /** Appends `item`; returns the oldest item when the buffer was full (dropped for it). */
  push(item: T): T | undefined {
    let dropped: T | undefined;
    if (this._length === this._capacity) {
      dropped = this.shift();
    }
    this._items[(this._start + this._length) % this._capacity] = item;
    this._length++;
    return dropped;
  }

  /** Removes and returns the oldest item; `undefined` when empty. */
  shift(): T | undefined {
    if (this._length === 0) {
      return undefined;
    }
    const item = this._items[this._start];
    this._items[this._start] = undefined;
    this._start = (this._start + 1) % this._capacity;
    this._length--;
    return item;
  }

  /** The item `index` places from the oldest (0) on; negative counts from the newest (-1); else `undefined`. */
  at(index: number): T | undefined {
    const i = index < 0 ? this._length + index : index;
    if (!Number.isInteger(i) || i < 0 || i >= this._length) {
      return undefined;
    }
    return this._items[(this._start + i) % this._capacity];
  }

  /** The newest item; `undefined` when empty. */
  last(): T | undefined {
    return this.at(-1);
  }

  /** Removes the oldest items while `predicate` holds for them; returns how many went. */
  dropWhile(predicate: (item: T) => boolean): number {
    let dropped = 0;
    while (this._length > 0 && predicate(this._items[this._start] as T)) {
      this.shift();
      dropped++;
    }
    return dropped;
  }

  /** The items, oldest first. */
  toArray(): T[] {
    const out: T[] = [];
    for (let i = 0; i < this._length; i++) {
      out.push(this._items[(this._start + i) % this._capacity] as T);
    }
    return out;
  }

  /** Another capacity, keeping the newest items that fit. */
  resize(capacity: number): void {
    const size = RingBuffer._checked(capacity);
    const kept = this.toArray().slice(-size);
    this._capacity = size;
    this._items = kept;
    this._start = 0;
    this._length = kept.length;
  }

  clear(): void {
    this._items = [];
    this._start = 0;
    this._length = 0;
  }

  private static _checked(capacity: number): number {
    if (!Number.isInteger(capacity) || capacity < 1) {
      throw new RangeError(`a ring buffer needs a whole capacity of at least 1, not ${capacity}`);
    }
    return capacity;
  }

  private _items: Array<T | undefined> = [];
  private _start = 0;
  private _length = 0;
  private _capacity: number;
}

/**
 * One reading of a GPU of the slice or of one kernel. A gap sample (`gap`
 * true) says the server gave no reading at `t`: its figures are null.
 */
export interface ISample {
  /** When the answer came, ms since the epoch. */
  t: number;
  /** No reading here: the server did not answer, or the slice file could not be read. */
  gap: boolean;
  /** Bytes on the GPU: the GPU's for the slice, the kernel's own for a kernel; null in a gap. */
  used: number | null;
  /** Percent of the GPU's SMs in use (a kernel's summed over its GPUs); null in a gap. */
  sm: number | null;
  /**
   * The memory cap drawn with it, bytes: the GPU's; for a kernel, the caps of
   * the GPUs it holds memory on, added up as its bytes are (on one GPU that
   * GPU's cap; before it holds any, the slice's fullest GPU's): 2.6 GiB on two
   * GPUs of 2.0 GiB caps is 2.6 of 4.0 GiB, never over one cap no GPU is
   * over. 0: no cap.
   */
  cap: number;
  /**
   * A kernel on several GPUs: its bytes and the cap on each, in the slice's
   * order (the chart's label says them); null or missing otherwise.
   */
  split?: ISplit[] | null;
  /** The SM share drawn with it, percent; 0: no SM limit. */
  share: number;
  /** The guard's real bytes on the GPU (its memory_real); null without a guard, and for kernels. */
  real: number | null;
  /** Bytes held in host memory by parked kernels (the GPU's), or by this kernel. */
  parked: number;
  /** A kernel's parking state; null for GPUs. */
  state: ParkState | null;
}

/** A kernel's memory on one of its GPUs, against that GPU's cap. */
export interface ISplit {
  /** The GPU's index in the slice. */
  gpu: number;
  used: number;
  /** Bytes; 0: no cap. */
  cap: number;
}

/**
 * One reading of a GPU as a whole (the status's `whole_gpus`, NVML's
 * figures); each null where NVML did not say, all of them in a gap.
 */
export interface IWholeSample {
  t: number;
  gap: boolean;
  /** Percent of the time a kernel ran on the GPU. */
  util: number | null;
  /** Bytes in use on the GPU, every process's. */
  used: number | null;
  /** The GPU's memory, bytes. */
  total: number | null;
  /** This slice's bytes on it. */
  slice: number | null;
  /** Watts drawn, and the limit. */
  power: number | null;
  power_limit: number | null;
  /** Degrees Celsius. */
  temp: number | null;
}

/** The default of the chart history setting (schema/plugin.json says the same). */
export const DEFAULT_HISTORY_MINUTES = 5;
export const MIN_HISTORY_MINUTES = 1;
export const MAX_HISTORY_MINUTES = 60;

/** The history setting in ms: whole minutes within [MIN, MAX]_HISTORY_MINUTES, the default if unusable. */
export function normalizeHistoryMinutes(value: unknown): number {
  if (typeof value !== 'number' || !Number.isFinite(value)) {
    return DEFAULT_HISTORY_MINUTES;
  }
  return Math.min(MAX_HISTORY_MINUTES, Math.max(MIN_HISTORY_MINUTES, Math.round(value)));
}

/**
 * The readings a series keeps for a window of `windowMs` polled at intervals
 * of at least `minIntervalMs`: twice what the window holds (a refresh on
 * showing the panel or after a kernel action comes between two polls), plus
 * one for the reading just before the window.
 */
export function historyCapacity(windowMs: number, minIntervalMs: number): number {
  return 2 * Math.ceil(windowMs / Math.max(1, minIntervalMs)) + 1;
}

/** A finite, non-negative number, else 0. */
function count(value: unknown): number {
  return typeof value === 'number' && Number.isFinite(value) && value > 0 ? value : 0;
}

/** A finite, non-negative number, else null. */
function countOrNull(value: unknown): number | null {
  return typeof value === 'number' && Number.isFinite(value) && value >= 0 ? value : null;
}

const PARK_STATES: readonly ParkState[] = ['running', 'parking', 'parked', 'resuming'];

function gapSample(t: number): ISample {
  return { t, gap: true, used: null, sm: null, cap: 0, share: 0, real: null, parked: 0, state: null };
}

/** The sample of one GPU in an answer. */
export function gpuSample(gpu: IGpuStatus, t: number): ISample {
  return {
    t,
    gap: false,
    used: count(gpu.memory_used),
    sm: count(gpu.sm_util),
    cap: count(gpu.memory_limit),
    share: count(gpu.sm_share),
    real: countOrNull(gpu.memory_real),
    parked: count(gpu.memory_parked),
    state: null
  };
}

/**
 * The sample of one kernel in an answer: its own bytes and SM use, against
 * the caps of the GPUs it holds memory on, added up (kernelSplit: one GPU's
 * cap on one GPU; no cap line when one of them has none; else the slice's
 * fullest GPU's, memoryHeadline) and the slice's share. On several GPUs,
 * `split` says each.
 */
export function kernelSample(kernel: ISliceKernel, status: IKernelSliceStatus, t: number): ISample {
  const state = kernel.park_state;
  const held = kernelSplit(kernel, status);
  const caps = held.map(({ gpu }) => count(gpu.memory_limit));
  const cap =
    held.length === 0
      ? (memoryHeadline(status)?.limit ?? 0)
      : caps.every(c => c > 0)
        ? caps.reduce((a, b) => a + b, 0)
        : 0;
  return {
    t,
    gap: false,
    used: count(kernel.memory_used),
    sm: count(kernel.sm_util),
    cap,
    share: count(status.sm_share),
    real: null,
    split:
      held.length > 1
        ? held.map(({ gpu, used }) => ({ gpu: gpu.index, used, cap: count(gpu.memory_limit) }))
        : null,
    parked: count(kernel.memory_parked),
    state: typeof state === 'string' && PARK_STATES.includes(state) ? state : 'running'
  };
}

/** A number NVML gave, else null. */
function figure(value: unknown): number | null {
  return typeof value === 'number' && Number.isFinite(value) && value >= 0 ? value : null;
}

/** The sample of a whole GPU in an answer (its `whole_gpus` entry). */
export function wholeSample(gpu: IWholeGpu, t: number): IWholeSample {
  return {
    t,
    gap: false,
    util: figure(gpu.utilization),
    used: figure(gpu.memory_used),
    total: figure(gpu.memory_total),
    slice: figure(gpu.slice_used),
    power: figure(gpu.power_w),
    power_limit: figure(gpu.power_limit_w),
    temp: figure(gpu.temperature_c)
  };
}

function wholeGap(t: number): IWholeSample {
  return { t, gap: true, util: null, used: null, total: null, slice: null, power: null, power_limit: null, temp: null };
}

/** The key of a GPU's series: its index in the slice. */
export function gpuKey(gpu: IGpuStatus): string {
  return String(gpu.index);
}

/**
 * The history of one slice: a ring buffer per GPU and per kernel. It belongs
 * to the slice, not to a kernel: switching between notebooks of one slice
 * keeps it, an answer from another slice starts it afresh. Samples older than
 * the window (but the last one before it, where a line enters from the left)
 * are dropped as new ones come; a kernel or GPU without a reading in the
 * window is forgotten.
 */
export class SliceHistory {
  constructor(options: SliceHistory.IOptions) {
    this._minIntervalMs = Math.max(1, options.minIntervalMs);
    this._windowMs = SliceHistory._checkedWindow(options.windowMs);
  }

  /** The path of the slice file whose history this is; `null` before the first answer. */
  get slice(): string | null {
    return this._slice;
  }

  /** How far back the series reach, ms. */
  get windowMs(): number {
    return this._windowMs;
  }

  set windowMs(ms: number) {
    const windowMs = SliceHistory._checkedWindow(ms);
    if (windowMs === this._windowMs) {
      return;
    }
    this._windowMs = windowMs;
    for (const buffer of [...this._gpus.values(), ...this._kernels.values()]) {
      buffer.resize(this._capacity());
    }
  }

  /** The number of samples one series keeps at most. */
  get capacity(): number {
    return this._capacity();
  }

  /**
   * Adds the readings of one answer at time `t`: usable answers (in a slice,
   * the file readable) give each GPU and kernel in them a sample, and every
   * series the answer lacks a gap; an unreadable slice file gives every
   * series a gap; an answer outside a slice adds nothing.
   */
  record(status: IKernelSliceStatus, t: number): void {
    if (!status.in_slice) {
      return;
    }
    const slice = status.path ?? status.slice ?? null;
    if (slice !== this._slice) {
      this.clear();
      this._slice = slice;
    }
    if (status.error !== undefined) {
      this.recordGap(t);
      return;
    }
    const seenGpus = new Set<string>();
    for (const gpu of status.gpus ?? []) {
      const key = gpuKey(gpu);
      seenGpus.add(key);
      this._series(this._gpus, key).push(gpuSample(gpu, t));
    }
    const seenKernels = new Set<string>();
    for (const kernel of status.kernels ?? []) {
      seenKernels.add(kernel.kernel_id);
      this._series(this._kernels, kernel.kernel_id).push(kernelSample(kernel, status, t));
    }
    const seenWhole = new Set<string>();
    for (const gpu of status.whole_gpus ?? []) {
      const key = String(gpu.index);
      seenWhole.add(key);
      this._series(this._whole, key).push(wholeSample(gpu, t));
    }
    this._gapExcept(this._gpus, seenGpus, t);
    this._gapExcept(this._kernels, seenKernels, t);
    this._gapExcept(this._whole, seenWhole, t, wholeGap);
    this._prune(t);
  }

  /**
   * The server's samples of slice `slice` (its file's path) from before this
   * page's first poll: each series gets those older than its first sample of
   * its own, in front of them. For another slice than the one recorded, or
   * samples not shaped as ISample, nothing changes. Returns how many were added.
   */
  seed(slice: string, kept: IKeptHistory): number {
    if (slice !== this._slice) {
      return 0;
    }
    let added = 0;
    for (const [map, series] of [
      [this._gpus, kept.gpus],
      [this._kernels, kept.kernels],
      [this._whole, kept.whole]
    ] as Array<[Map<string, RingBuffer<ITimed>>, Record<string, unknown> | undefined]>) {
      for (const [key, samples] of Object.entries(series ?? {})) {
        const earlier = (Array.isArray(samples) ? samples : []).filter(isSample);
        const buffer = this._series(map, key);
        const first = buffer.at(0)?.t ?? Infinity;
        const before = earlier.filter(s => s.t < first);
        if (before.length === 0) {
          continue;
        }
        const own = buffer.toArray();
        buffer.clear();
        for (const sample of [...before, ...own]) {
          buffer.push(sample);
        }
        added += before.length;
      }
    }
    return added;
  }

  /** A poll at time `t` that got no reading: a gap in every series. */
  recordGap(t: number): void {
    this._gapExcept(this._gpus, new Set(), t);
    this._gapExcept(this._kernels, new Set(), t);
    this._gapExcept(this._whole, new Set(), t, wholeGap);
    this._prune(t);
  }

  /** The keys of the GPUs with a series (their indices), in index order. */
  gpuKeys(): string[] {
    return [...this._gpus.keys()].sort((a, b) => Number(a) - Number(b));
  }

  /** The kernels with a series. */
  kernelIds(): string[] {
    return [...this._kernels.keys()];
  }

  /** The samples of GPU `key` (gpuKey), oldest first; empty when unknown. */
  gpu(key: string): ISample[] {
    return this._gpus.get(key)?.toArray() ?? [];
  }

  /** The samples of kernel `kernelId`, oldest first; empty when unknown. */
  kernel(kernelId: string): ISample[] {
    return this._kernels.get(kernelId)?.toArray() ?? [];
  }

  /** The samples of GPU `key` (its index) as a whole, oldest first; empty when unknown. */
  whole(key: string): IWholeSample[] {
    return this._whole.get(key)?.toArray() ?? [];
  }

  clear(): void {
    this._gpus.clear();
    this._kernels.clear();
    this._whole.clear();
    this._slice = null;
  }

  private _capacity(): number {
    return historyCapacity(this._windowMs, this._minIntervalMs);
  }

  private _series<T extends ITimed>(map: Map<string, RingBuffer<T>>, key: string): RingBuffer<T> {
    let buffer = map.get(key);
    if (!buffer) {
      buffer = new RingBuffer<T>(this._capacity());
      map.set(key, buffer);
    }
    return buffer;
  }

  private _gapExcept<T extends ITimed>(
    map: Map<string, RingBuffer<T>>,
    seen: Set<string>,
    t: number,
    gap: (t: number) => T = gapSample as unknown as (t: number) => T
  ): void {
    for (const [key, buffer] of map) {
      // One gap sample is enough to break a line: no run of them.
      if (!seen.has(key) && !buffer.last()?.gap) {
        buffer.push(gap(t));
      }
    }
  }

  /** Drops what is older than the window, keeping the last reading before it; forgets empty series. */
  private _prune(now: number): void {
    const start = now - this._windowMs;
    for (const map of [this._gpus, this._kernels, this._whole] as Array<Map<string, RingBuffer<ITimed>>>) {
      for (const [key, buffer] of map) {
        // The oldest goes while the next one is still before the window.
        while (buffer.length > 1 && (buffer.at(1) as ITimed).t <= start) {
          buffer.shift();
        }
        const readings = buffer.toArray().some(s => !s.gap && s.t >= start);
        if (!readings) {
          map.delete(key);
        }
      }
    }
  }

  private static _checkedWindow(ms: number): number {
    if (!Number.isFinite(ms) || ms <= 0) {
      throw new RangeError(`a history window must be a positive number of ms, not ${ms}`);
    }
    return ms;
  }

  private _slice: string | null = null;
  private _windowMs: number;
  private readonly _minIntervalMs: number;
  private _gpus = new Map<string, RingBuffer<ISample>>();
  private _kernels = new Map<string, RingBuffer<ISample>>();
  private _whole = new Map<string, RingBuffer<IWholeSample>>();
}

/** The server's history of a slice (`GET hami/v1/kernels/<id>/history`), by GPU key and kernel id. */
export interface IKeptHistory {
  gpus?: Record<string, unknown>;
  kernels?: Record<string, unknown>;
  /** The whole GPUs' samples, by GPU key (older servers: none). */
  whole?: Record<string, unknown>;
}

/** What every sample has: when, and whether it is a reading. */
export interface ITimed {
  t: number;
  gap: boolean;
}

/** Whether `value` is a sample as the server keeps them (`t` a number, `gap` true or false). */
export function isSample(value: unknown): value is ISample {
  if (typeof value !== 'object' || value === null) {
    return false;
  }
  const s = value as Record<string, unknown>;
  return typeof s.t === 'number' && Number.isFinite(s.t) && typeof s.gap === 'boolean';
}

export namespace SliceHistory {
  export interface IOptions {
    /** How far back the series reach, ms. */
    windowMs: number;
    /** The shortest interval between two polls (the refresh rate's minimum), ms: sizes the buffers. */
    minIntervalMs: number;
  }
}

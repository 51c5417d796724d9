/**
 * The answer of the server extension's `GET {baseUrl}hami/v1/kernels/<id>`
 * (hami_jupyter/server), as this extension reads it. Every usage field is
 * optional: a kernel outside a slice carries only `kernel_id`, `in_slice` and
 * `reason`, and a slice whose file cannot be read carries `error` instead.
 */

/** Memory pressure of a slice or GPU. */
export type Level = 'ok' | 'warning' | 'critical';

/**
 * Where a kernel's GPU memory is ("parking"): `running` on the GPU; `parking`
 * while it moves to host memory; `parked` in host memory (the kernel is idle;
 * its memory comes back before its next cell); `resuming` while it moves back.
 * Servers without parking send no state: read as `running` (format.ts,
 * parkInfo).
 */
export type ParkState = 'running' | 'parking' | 'parked' | 'resuming';

/**
 * The parking fields of a kernel, in the status's `kernel` and in each entry
 * of `kernels[]`. All optional: older servers send none of them, which reads
 * as running, nothing parked, nothing waited for.
 */
export interface IParkFields {
  /** Missing: `running`. */
  park_state?: ParkState;
  /** Bytes of the kernel's GPU memory held in host memory; missing: 0. */
  memory_parked?: number;
  /**
   * What a resume waits for, e.g. "room under the slice's memory cap" or
   * "free memory on the GPU"; null or missing: nothing.
   */
  park_wait?: string | null;
  /**
   * Why the kernel was parked: `idle` (the server's idle policy), `asked`
   * (a user or an administrator), `room` (the memory broker, to make room
   * for another user's work), `guard` (over the cap by the driver's figures);
   * null or missing while not parked, or unknown.
   */
  park_reason?: string | null;
  /**
   * A wait for room on a full GPU (the memory broker makes it by parking idle
   * kernels): the oldest of the kernel's processes'; null or missing: none.
   */
  room_wait?: IRoomWait | null;
}

/** A process's wait for GPU room (its slot's room_wait fields). */
export interface IRoomWait {
  /** The GPU it waits on. */
  uuid?: string | null;
  /** The bytes it asked for. */
  bytes?: number;
  /** When the wait began (Unix seconds). */
  since_unix?: number;
}

/**
 * What the guard (`hami-jupyter guard`, on the host) sees of a GPU of the
 * slice: `ok`, or `over` its memory cap. The guard reads every GPU process's
 * real memory from NVML, beside what the slice counts (reported).
 */
export type GuardState = 'ok' | 'over';

/**
 * The guard's fields of a GPU. All optional: older servers send none of them,
 * and without a guard running (no fresh report) they are null; either reads
 * as "no guard".
 */
export interface IGuardGpuFields {
  /** Bytes the guard reads from NVML for the slice's processes on this GPU. */
  memory_real?: number | null;
  guard_state?: GuardState | null;
  /** The cap the guard measured against, in bytes. */
  guard_limit?: number | null;
  /** What the slice counted when the guard looked, in bytes. */
  guard_reported?: number | null;
}

/** Whether a guard runs for the slice (its `guard` entry); missing: no guard. */
export interface IGuardInfo {
  /** A fresh report of the guard exists. */
  running?: boolean;
  /** What the guard does to a slice over its cap, e.g. "kill". */
  action?: string | null;
  written_unix?: number | null;
  /** Why a report that exists cannot be read. */
  error?: string | null;
  /** Processes of the slice the guard parked (kept while the guard is down); missing: none. */
  parked?: IGuardParked[];
}

/**
 * A process of the slice the guard parked: it held memory no cap allowed; its
 * GPU state waits in host memory until an administrator resumes or ends it.
 */
export interface IGuardParked {
  pid: number;
  user?: string | null;
  command?: string | null;
  uuid?: string | null;
  /** Bytes the process held on the GPU when it was parked. */
  process_bytes?: number | null;
  /** When it was parked (Unix seconds). */
  unix?: number | null;
  /** The guard's reason. */
  why?: string | null;
}

/** One GPU of the slice. */
export interface IGpuStatus extends IGuardGpuFields {
  index: number;
  uuid?: string;
  memory_total?: number;
  memory_used: number;
  memory_peak?: number;
  /** Bytes; 0: no cap on this GPU. */
  memory_limit: number;
  /**
   * Bytes the slice keeps on this GPU whatever others need: its guarantee,
   * the cap where none is set. Above it, up to the cap, memory is lent (the
   * memory broker may take it back by parking idle kernels). Missing (older
   * servers): the cap.
   */
  memory_guarantee?: number;
  memory_level?: Level;
  sm_count?: number;
  /** Percent; 0: no SM limit. */
  sm_share: number;
  sm_util: number;
  mode?: string;
  limit_is_fallback?: boolean;
  /** Bytes of this GPU's memory that parked kernels hold in host memory; missing: 0. */
  memory_parked?: number;
  /**
   * When the slice holds more than a cap an administrator lowered since: the
   * time of that change (Unix seconds; the memory was held before it). New
   * allocations are refused until use falls below the cap; nothing is taken.
   * Null or missing: not over a lowered cap.
   */
  over_cap_since?: number | null;
}

/** One kernel of the slice (of this server or of another one), with its parking fields. */
export interface ISliceKernel extends IParkFields {
  kernel_id: string;
  /**
   * The notebook it serves: its Jupyter session's path, as JupyterLab's file
   * browser names it (this server's kernels by their sessions, others as
   * their registry entries say); null or missing: unknown (an older server,
   * a kernel without a session). People tell kernels apart by it.
   */
  notebook?: string | null;
  user?: string;
  kernelspec?: string;
  pid?: number | null;
  processes?: unknown[];
  memory_used: number;
  sm_util: number;
  /** Only kernels of this Jupyter server can be interrupted, restarted, shut down, parked or resumed from here. */
  this_server: boolean;
}

/** The status's own kernel: its use of the slice and its parking fields. */
export interface IKernelUsage extends IParkFields {
  memory_used: number;
  sm_util: number;
  processes?: unknown[];
}

/**
 * A GPU of the slice as a whole, as NVML sees it (nvdashboard's figures): every
 * process's memory, utilization, power, temperature; who holds the memory. Each
 * figure null where NVML does not say.
 */
export interface IWholeGpu {
  /** The slice's index of the GPU (as in `gpus`). */
  index: number;
  uuid: string;
  name?: string;
  memory_total?: number;
  /** Bytes in use on the GPU, every process's. */
  memory_used?: number | null;
  /** Percent of the time a kernel ran on it. */
  utilization?: number | null;
  power_w?: number | null;
  power_limit_w?: number | null;
  temperature_c?: number | null;
  /** This slice's bytes there. */
  slice_used?: number;
  /** Other slices this user may read (an administrator: everyone's), by name. */
  slices?: Array<{ slice: string; memory_used: number }>;
  /** Everything else NVML sees there, one total: other users, processes outside slices, the driver. */
  others_used?: number | null;
}

/** The answer for one kernel. */
export interface IKernelSliceStatus {
  kernel_id: string;
  /** The notebook this kernel serves (its session's path); null or missing: unknown. */
  notebook?: string | null;
  in_slice: boolean;
  /** Why the kernel is not in a slice (in_slice false). */
  reason?: string;
  slice?: string;
  path?: string;
  /**
   * Bytes used on the slice's fullest GPU (the highest used / cap), never a
   * sum over GPUs; before any GPU, 0. Older servers sent the sum: the
   * extension reads the fullest GPU from `gpus` itself (format.ts,
   * memoryHeadline).
   */
  memory_used?: number;
  /** Bytes; that GPU's cap (before any GPU, the cap every GPU gets), 0: no cap. */
  memory_limit?: number;
  /** The index of the GPU `memory_used` and `memory_limit` are of; null before any GPU. */
  memory_gpu?: number | null;
  /** That GPU's guarantee in bytes (the cap where none is set); missing: the cap. */
  memory_guarantee?: number;
  /**
   * The server's level of the whole slice, measured with warning_fraction and
   * critical_fraction: used only where there is no cap to measure here.
   */
  memory_level?: Level;
  /** Percent; 0: no SM limit. */
  sm_share?: number;
  sm_util?: number;
  /** This kernel's own share of the slice, and where its memory is (parking). */
  kernel?: IKernelUsage;
  gpus?: IGpuStatus[];
  kernels?: ISliceKernel[];
  /**
   * The fraction of a memory cap (in [0, 1]) from which the server calls the
   * memory use a warning; this extension measures the slice and its GPUs with
   * it too. Sent with the usage fields; the server's configuration sets it.
   */
  warning_fraction?: number;
  /**
   * The fraction of a memory cap (in [0, 1], not below warning_fraction) from
   * which the memory use is critical. Without a usable pair of fractions the
   * extension falls back to 0.8 and 0.95 (format.ts, statusThresholds).
   */
  critical_fraction?: number;
  /** The guard's bytes over the slice's GPUs; null or missing: no guard, or not every GPU known. */
  memory_real?: number | null;
  /** `over` when the guard sees any GPU of the slice over its cap; null or missing: no guard. */
  guard_state?: GuardState | null;
  /** Whether a guard runs, and its action; missing (older servers): no guard. */
  guard?: IGuardInfo | null;
  /** The whole GPUs of the slice (NVML's figures); missing (older servers): not shown. */
  whole_gpus?: IWholeGpu[];
  /** Why NVML cannot tell of them; null or missing: nothing to say. */
  whole_gpus_error?: string | null;
  /** Present instead of the usage fields when the slice file cannot be read. */
  error?: string;
}

/** The memory levels' thresholds, as fractions of the memory cap (from the server's answer). */
export interface IThresholds {
  warning: number;
  critical: number;
}

/** The answer of `POST {baseUrl}hami/v1/kernels/<id>/park` (200). */
export interface IParkResult {
  kernel_id: string;
  park_state: 'parked';
  /** Bytes moved to host memory. */
  parked_bytes: number;
  /** How long the parking took. */
  seconds: number;
}

/** The answer of `POST {baseUrl}hami/v1/kernels/<id>/resume` (200). */
export interface IResumeResult {
  kernel_id: string;
  park_state: 'running';
  /** Bytes moved back to the GPU. */
  restored_bytes: number;
  /** How long the resume took, waiting for room included. */
  seconds: number;
}

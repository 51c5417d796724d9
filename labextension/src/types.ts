/**
 * The answer of the server extension's `GET {baseUrl}hami/v1/kernels/<id>`
 * (hami_jupyter/server), as this extension reads it. Every usage field is
 * optional: a kernel outside a slice carries only `kernel_id`, `in_slice` and
 * `reason`, and a slice whose file cannot be read carries `error` instead.
 */

/** Memory pressure of a slice or GPU. */
export type Level = 'ok' | 'warning' | 'critical';

/** One GPU of the slice. */
export interface IGpuStatus {
  index: number;
  uuid?: string;
  memory_total?: number;
  memory_used: number;
  memory_peak?: number;
  /** Bytes; 0: no cap on this GPU. */
  memory_limit: number;
  memory_level?: Level;
  sm_count?: number;
  /** Percent; 0: no SM limit. */
  sm_share: number;
  sm_util: number;
  mode?: string;
  limit_is_fallback?: boolean;
}

/** One kernel of the slice (of this server or of another one). */
export interface ISliceKernel {
  kernel_id: string;
  user?: string;
  kernelspec?: string;
  pid?: number | null;
  processes?: unknown[];
  memory_used: number;
  sm_util: number;
  /** Only kernels of this Jupyter server can be interrupted, restarted or shut down from here. */
  this_server: boolean;
}

/** The answer for one kernel. */
export interface IKernelSliceStatus {
  kernel_id: string;
  in_slice: boolean;
  /** Why the kernel is not in a slice (in_slice false). */
  reason?: string;
  slice?: string;
  path?: string;
  /** Bytes used by the whole slice. */
  memory_used?: number;
  /** Bytes; the whole slice's cap, 0: no cap. */
  memory_limit?: number;
  /**
   * The server's level of the whole slice, measured with warning_fraction and
   * critical_fraction: used only where there is no cap to measure here.
   */
  memory_level?: Level;
  /** Percent; 0: no SM limit. */
  sm_share?: number;
  sm_util?: number;
  kernel?: { memory_used: number; sm_util: number; processes?: unknown[] };
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
  /** Present instead of the usage fields when the slice file cannot be read. */
  error?: string;
}

/** The memory levels' thresholds, as fractions of the memory cap (from the server's answer). */
export interface IThresholds {
  warning: number;
  critical: number;
}

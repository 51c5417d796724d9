/**
 * Pure functions behind the status bar item and the slice panel: number
 * formatting, the status text, memory levels from the server's thresholds,
 * and reading the server's answer. No DOM and no JupyterLab here, so the unit
 * tests run in plain Node.
 */

import {
  IGpuStatus,
  IGuardParked,
  IKernelSliceStatus,
  IParkFields,
  IParkResult,
  IResumeResult,
  IRoomWait,
  ISliceKernel,
  IThresholds,
  IWholeGpu,
  Level,
  ParkState
} from './types';

export const KIB = 1024;
export const MIB = 1024 * KIB;
export const GIB = 1024 * MIB;

/** The refresh rate setting's default and minimum (schema/plugin.json says the same). */
export const DEFAULT_REFRESH_RATE = 2000;
export const MIN_REFRESH_RATE = 500;

/**
 * The thresholds used when the server sends none that are usable (see
 * statusThresholds): a fallback only, the server's answer says which apply.
 */
export const DEFAULT_THRESHOLDS: Readonly<IThresholds> = Object.freeze({
  warning: 0.8,
  critical: 0.95
});

export const LEVELS: readonly Level[] = ['ok', 'warning', 'critical'];

/** The CSS class of each level, e.g. `hami-level-warning`. */
export function levelClass(level: Level): string {
  return `hami-level-${level}`;
}

export const LEVEL_CLASSES: readonly string[] = LEVELS.map(levelClass);

/** A finite, non-negative number, else 0. */
function count(value: unknown): number {
  return typeof value === 'number' && Number.isFinite(value) && value > 0
    ? value
    : 0;
}

/** Bytes as GiB with one decimal, no unit: `1288490188` -> `"1.2"`. */
export function formatGiB(bytes: number): string {
  return (count(bytes) / GIB).toFixed(1);
}

/**
 * The memory part of the status text: `"1.2 / 4.0 GiB"`, or `"1.2 GiB"` when
 * there is no cap (limit 0).
 */
export function formatMemory(used: number, limit: number): string {
  if (count(limit) > 0) {
    return `${formatGiB(used)} / ${formatGiB(limit)} GiB`;
  }
  return `${formatGiB(used)} GiB`;
}

/** A percentage, rounded: `23.4` -> `"23 %"`. */
export function formatPercent(percent: number): string {
  return `${Math.round(count(percent))} %`;
}

/** The SM part: `"SM 23 % / 25 %"`, or `"SM 23 %"` without an SM limit (share 0). */
export function formatSM(util: number, share: number): string {
  if (count(share) > 0) {
    return `SM ${formatPercent(util)} / ${formatPercent(share)}`;
  }
  return `SM ${formatPercent(util)}`;
}

/**
 * A size for the panel, in the largest unit it reaches:
 * `"512 B"`, `"12 KiB"`, `"300 MiB"`, `"1.2 GiB"`.
 */
export function formatBytes(bytes: number): string {
  const b = count(bytes);
  // Rounding can reach the next unit (1023.6 MiB): that is shown in the next one.
  if (b >= GIB || Math.round(b / MIB) >= 1024) {
    return `${formatGiB(b)} GiB`;
  }
  if (b >= MIB || Math.round(b / KIB) >= 1024) {
    return `${Math.round(b / MIB)} MiB`;
  }
  if (b >= KIB) {
    return `${Math.round(b / KIB)} KiB`;
  }
  return `${Math.round(b)} B`;
}

/** The first characters of a kernel id, enough to tell kernels apart. */
export function shortId(kernelId: string): string {
  return kernelId.slice(0, 8);
}

/** A kernel's notebook (its session's path), or `null` when the server does not know it. */
export function kernelNotebook(kernel: { notebook?: string | null } | null | undefined): string | null {
  const notebook = kernel?.notebook;
  return typeof notebook === 'string' && notebook.trim() !== '' ? notebook : null;
}

/**
 * A kernel as people name it, as JupyterLab's Running panel does: its
 * notebook's path (`"work/analysis.ipynb"`); without one, its short id.
 */
export function kernelName(kernel: { kernel_id: string; notebook?: string | null }): string {
  return kernelNotebook(kernel) ?? shortId(kernel.kernel_id);
}

/** A kernel's tooltip: `"kernel 0123…cdef: work/analysis.ipynb"` (the whole id, and its notebook). */
export function kernelTitle(kernel: { kernel_id: string; notebook?: string | null }): string {
  const notebook = kernelNotebook(kernel);
  return `kernel ${kernel.kernel_id}` + (notebook !== null ? `: ${notebook}` : '');
}

/**
 * How full a GPU is, to compare GPUs: `[1, used / cap]` with a cap (gpuCap:
 * no more than the GPU has), `[0, used]` without one, so that any capped GPU
 * comes before every uncapped one.
 */
function gpuFill(gpu: IGpuStatus): [number, number] {
  const cap = gpuCap(gpu);
  return cap > 0 ? [1, count(gpu.memory_used) / cap] : [0, count(gpu.memory_used)];
}

/**
 * The GPU nearest its cap (the first of equals); `null` for none. It refuses
 * an allocation first: a cap holds per GPU, so the slice's memory is shown as
 * that GPU's, never as a sum over GPUs (3.5 of 4 GiB on GPU 0 is not 3.5 of
 * the 8 GiB two GPUs' caps add up to: the next 1 GiB there is refused).
 */
export function fullestGpu(gpus: readonly IGpuStatus[] | undefined): IGpuStatus | null {
  let best: IGpuStatus | null = null;
  let bestFill: [number, number] = [-1, -1];
  for (const gpu of gpus ?? []) {
    const fill = gpuFill(gpu);
    if (fill[0] > bestFill[0] || (fill[0] === bestFill[0] && fill[1] > bestFill[1])) {
      best = gpu;
      bestFill = fill;
    }
  }
  return best;
}

/** The memory a status headlines (memoryHeadline). */
export interface IMemoryHeadline {
  /** Bytes in use on that GPU. */
  used: number;
  /** Its cap in bytes; 0: no cap. */
  limit: number;
  /** The GPU's index; `null` before the slice used any GPU. */
  gpu: number | null;
  /** How many GPUs the slice has used: the headline names its GPU only among several. */
  gpuCount: number;
}

/**
 * The memory the status bar, the panel's summary and its meter show: the
 * fullest GPU's (fullestGpu), from `gpus` (so a server that sends sums at the
 * top level is read right too); before the slice used any GPU the status's
 * own figures (the cap every GPU gets). `null` outside a slice and for an
 * unreadable slice file.
 */
export function memoryHeadline(status: IKernelSliceStatus | null): IMemoryHeadline | null {
  if (!status || !status.in_slice || status.error !== undefined) {
    return null;
  }
  const gpus = status.gpus ?? [];
  const gpu = fullestGpu(gpus);
  if (gpu === null) {
    return { used: count(status.memory_used), limit: count(status.memory_limit), gpu: null, gpuCount: 0 };
  }
  return {
    used: count(gpu.memory_used),
    limit: count(gpu.memory_limit),
    gpu: gpu.index,
    gpuCount: gpus.length
  };
}

/** Text for a status that has no usage: not in a slice, or an unreadable slice file. */
export const UNREADABLE_TEXT = 'vGPU (slice unreadable)';

/**
 * The slice's usage: `"vGPU 1.2 / 4.0 GiB · SM 23 % / 25 %"`; without a
 * memory cap `"vGPU 1.2 GiB · SM 23 % / 25 %"`, without an SM limit
 * `"vGPU 1.2 / 4.0 GiB · SM 23 %"`. The memory is the fullest GPU's
 * (memoryHeadline), named when the slice has several:
 * `"vGPU 3.5 / 4.0 GiB (GPU 0) · SM 23 % / 25 %"`. `null` for a kernel
 * outside a slice. The panel's summary line, and the status bar text while
 * the kernel runs.
 */
export function sliceText(status: IKernelSliceStatus | null): string | null {
  if (!status || !status.in_slice) {
    return null;
  }
  const headline = memoryHeadline(status);
  if (status.error !== undefined || headline === null) {
    return UNREADABLE_TEXT;
  }
  const which = headline.gpuCount > 1 && headline.gpu !== null ? ` (GPU ${headline.gpu})` : '';
  const memory = formatMemory(headline.used, headline.limit) + which;
  const sm = formatSM(count(status.sm_util), count(status.sm_share));
  return `vGPU ${memory} · ${sm}`;
}

/**
 * The status bar text: the slice's usage (sliceText) while the kernel runs;
 * while its memory is parked `"vGPU parked · 8.0 GiB in host memory"`, while
 * it moves there `"vGPU parking…"`, while it comes back `"vGPU resuming…"`
 * (parkStatusText). `null` for a kernel outside a slice (the item is hidden
 * then).
 */
export function statusText(status: IKernelSliceStatus | null): string | null {
  const text = sliceText(status);
  if (text === null || !status || status.error !== undefined) {
    return text;
  }
  return parkStatusText(parkInfo(status.kernel)) ?? text;
}

/** `used / limit`, or `null` without a cap (limit 0). */
export function memoryFraction(used: number, limit: number): number | null {
  const cap = count(limit);
  return cap > 0 ? count(used) / cap : null;
}

/**
 * The level of `used` bytes of a `limit`: `"critical"` from the critical
 * threshold on (a fraction of the limit, inclusive), `"warning"` from the
 * warning threshold on, else `"ok"`; always `"ok"` without a cap.
 */
export function memoryLevel(
  used: number,
  limit: number,
  thresholds: IThresholds = DEFAULT_THRESHOLDS
): Level {
  const fraction = memoryFraction(used, limit);
  if (fraction === null) {
    return 'ok';
  }
  if (fraction >= thresholds.critical) {
    return 'critical';
  }
  if (fraction >= thresholds.warning) {
    return 'warning';
  }
  return 'ok';
}

/** The more severe of two levels. */
export function worseLevel(a: Level, b: Level): Level {
  return LEVELS.indexOf(a) >= LEVELS.indexOf(b) ? a : b;
}

/** `value` when it is one of the levels, else `null`. */
export function asLevel(value: unknown): Level | null {
  return typeof value === 'string' && (LEVELS as readonly string[]).includes(value)
    ? (value as Level)
    : null;
}

/** `value` when it is a fraction, a finite number in [0, 1]; else `null`. */
function fraction(value: unknown): number | null {
  return typeof value === 'number' && Number.isFinite(value) && value >= 0 && value <= 1
    ? value
    : null;
}

/**
 * The thresholds a status is measured with: the server's `warning_fraction`
 * and `critical_fraction`, when both are fractions (numbers in [0, 1]) and
 * the warning is not above the critical one. Anything else (a field missing,
 * not a number, out of range, or the two in the wrong order) gives
 * DEFAULT_THRESHOLDS for both: half of a pair that makes no sense is not
 * trusted either. Outside a slice, for an unreadable slice file and before
 * any answer, the defaults too.
 */
export function statusThresholds(status: IKernelSliceStatus | null): IThresholds {
  if (!status || !status.in_slice || status.error !== undefined) {
    return { ...DEFAULT_THRESHOLDS };
  }
  const warning = fraction(status.warning_fraction);
  const critical = fraction(status.critical_fraction);
  if (warning === null || critical === null || warning > critical) {
    return { ...DEFAULT_THRESHOLDS };
  }
  return { warning, critical };
}

/** The refresh rate from the settings in ms: at least MIN_REFRESH_RATE, the default if unusable. */
export function normalizeRefreshRate(value: unknown): number {
  if (typeof value !== 'number' || !Number.isFinite(value)) {
    return DEFAULT_REFRESH_RATE;
  }
  return Math.max(MIN_REFRESH_RATE, Math.round(value));
}

/** The cap a GPU's level is measured against: its limit, no more than the GPU has. */
function gpuCap(gpu: IGpuStatus): number {
  const limit = count(gpu.memory_limit);
  const total = count(gpu.memory_total);
  return limit > 0 && total > 0 ? Math.min(limit, total) : limit;
}

/**
 * The level of a kernel's slice, by default with the thresholds the status
 * itself carries (statusThresholds): the worst of its capped GPUs, each
 * against its own cap, which is the fullest GPU's (one full GPU is trouble
 * even when the others are empty); before the slice used any GPU, its own
 * figures against its cap. Without any cap to measure, or for an unreadable
 * slice file, the server's level (or "ok"). `null` for a kernel outside a
 * slice.
 */
export function sliceLevel(
  status: IKernelSliceStatus | null,
  thresholds: IThresholds = statusThresholds(status)
): Level | null {
  if (!status || !status.in_slice) {
    return null;
  }
  const fallback = asLevel(status.memory_level) ?? 'ok';
  if (status.error !== undefined) {
    return fallback;
  }
  let level: Level | null = null;
  const gpus = status.gpus ?? [];
  // The top-level figures only before any GPU: a server may send them summed over GPUs.
  if (gpus.length === 0 && count(status.memory_limit) > 0) {
    level = memoryLevel(count(status.memory_used), count(status.memory_limit), thresholds);
  }
  for (const gpu of gpus) {
    const cap = gpuCap(gpu);
    if (cap > 0) {
      const own = memoryLevel(count(gpu.memory_used), cap, thresholds);
      level = level === null ? own : worseLevel(level, own);
    }
  }
  return level ?? fallback;
}

/**
 * The level of one GPU with the given thresholds (those of its status, see
 * statusThresholds); its server level without a cap.
 */
export function gpuLevel(gpu: IGpuStatus, thresholds: IThresholds = DEFAULT_THRESHOLDS): Level {
  const cap = gpuCap(gpu);
  if (cap > 0) {
    return memoryLevel(count(gpu.memory_used), cap, thresholds);
  }
  return asLevel(gpu.memory_level) ?? 'ok';
}

/* The guard: what it reads from NVML, beside what the slice counts (reported). */

/**
 * The guard's real figure is shown beside the reported one only when they
 * differ by more than this many bytes plus REAL_SLACK_FRACTION of the reported
 * figure (hami_jupyter/slice/status.py says the same).
 */
export const REAL_SLACK_BYTES = 16 * MIB;
export const REAL_SLACK_FRACTION = 0.02;

/** A number of bytes as the guard sent it, or `null` (missing, null, not a count). */
function bytesOrNull(value: unknown): number | null {
  return typeof value === 'number' && Number.isFinite(value) && value >= 0 ? value : null;
}

/** The guard's real bytes of a GPU; `null` without a guard (or from an older server). */
export function gpuReal(gpu: IGpuStatus): number | null {
  return bytesOrNull(gpu.memory_real);
}

/** Whether `real` differs from `reported` by more than REAL_SLACK_BYTES + REAL_SLACK_FRACTION. */
export function realDiffers(real: number | null, reported: number): boolean {
  if (real === null) {
    return false;
  }
  const base = count(reported);
  return Math.abs(real - base) > REAL_SLACK_BYTES + REAL_SLACK_FRACTION * base;
}

/** `"real 1.4 GiB (guard)"` when the guard's figure differs from the reported one; else `null`. */
export function realText(gpu: IGpuStatus): string | null {
  const real = gpuReal(gpu);
  return realDiffers(real, count(gpu.memory_used)) ? `real ${formatBytes(real ?? 0)} (guard)` : null;
}

/** Whether the guard sees the GPU over its cap. */
export function gpuGuardOver(gpu: IGpuStatus): boolean {
  return gpu.guard_state === 'over' && gpuReal(gpu) !== null;
}

/**
 * The guard's line for a GPU it sees over its cap, `null` otherwise:
 * `"the guard sees 1.4 GiB really in use on this GPU, over the 1.0 GiB cap
 * (the slice counts 364 MiB)"` (the cap and the count as the guard saw them,
 * else the status's own).
 */
export function guardOverText(gpu: IGpuStatus): string | null {
  if (!gpuGuardOver(gpu)) {
    return null;
  }
  const limit = bytesOrNull(gpu.guard_limit) ?? count(gpu.memory_limit);
  const reported = bytesOrNull(gpu.guard_reported) ?? count(gpu.memory_used);
  return (
    `the guard sees ${formatBytes(gpuReal(gpu) ?? 0)} really in use on this GPU, over the ` +
    `${formatBytes(limit)} cap (the slice counts ${formatBytes(reported)})`
  );
}

/**
 * One line per GPU of the status that the guard sees over its cap, with the
 * guard's action: `"GPU 0: the guard sees … (the slice counts 364 MiB); the
 * guard's action: kill"`. Empty outside a slice, for an unreadable slice
 * file, and for answers without the guard's fields (older servers).
 */
export function guardOverLines(status: IKernelSliceStatus | null): string[] {
  if (!status || !status.in_slice || status.error !== undefined) {
    return [];
  }
  const action = typeof status.guard?.action === 'string' ? status.guard.action.trim() : '';
  const suffix = action !== '' ? `; the guard's action: ${action}` : '';
  const lines: string[] = [];
  for (const gpu of status.gpus ?? []) {
    const text = guardOverText(gpu);
    if (text !== null) {
      lines.push(`GPU ${gpu.index}: ${text}${suffix}`);
    }
  }
  return lines;
}

/** `"14:02"`: the local time of Unix seconds *unix*, as `%hami status` writes it. */
export function clockText(unix: number): string {
  const when = new Date(unix * 1000);
  const pad = (n: number) => String(n).padStart(2, '0');
  return `${pad(when.getHours())}:${pad(when.getMinutes())}`;
}

/**
 * The note for a GPU whose slice holds more than a cap lowered since, `null`
 * otherwise: `"over its new 20.0 GiB cap since 14:02, held before the change:
 * new allocations are refused until its use falls below the cap; nothing it
 * holds is taken"` (the words of `%hami status`).
 */
export function heldText(gpu: IGpuStatus): string | null {
  const since = gpu.over_cap_since;
  if (typeof since !== 'number' || !Number.isFinite(since)) {
    return null;
  }
  return (
    `over its new ${formatBytes(count(gpu.memory_limit))} cap since ${clockText(since)}, held ` +
    'before the change: new allocations are refused until its use falls below the cap; nothing ' +
    'it holds is taken'
  );
}

/** One line per GPU of the status held over a lowered cap (`"GPU 0: over its new …"`). */
export function heldLines(status: IKernelSliceStatus | null): string[] {
  if (!status || !status.in_slice || status.error !== undefined) {
    return [];
  }
  const lines: string[] = [];
  for (const gpu of status.gpus ?? []) {
    const text = heldText(gpu);
    if (text !== null) {
      lines.push(`GPU ${gpu.index}: ${text}`);
    }
  }
  return lines;
}

/**
 * One line for a process of the slice the guard parked, with the guard's
 * reason: `"pid 4242 (python train.py) parked by the guard 3 min ago: held
 * 1.5 GiB past the slice's cap without the preload library. Its 1.5 GiB are
 * safe in host memory; it waits until an administrator resumes it (after
 * raising the cap) or ends it"`. *now*: Unix seconds.
 */
export function guardParkedText(record: IGuardParked, now: number): string {
  const when = typeof record.unix === 'number' ? record.unix : now;
  const minutes = Math.floor(Math.max(0, now - when) / 60);
  const command = typeof record.command === 'string' && record.command !== '' ? record.command : '?';
  const why = typeof record.why === 'string' && record.why.trim() !== '' ? record.why.trim() : 'over its slice cap';
  const held = formatBytes(count(record.process_bytes ?? 0));
  return (
    `pid ${record.pid} (${command}) parked by the guard ${minutes} min ago: ${why}. Its ${held} ` +
    'are safe in host memory; it waits until an administrator resumes it (after raising the cap) ' +
    'or ends it'
  );
}

/** One line per process of the slice the guard parked; empty without any (or outside a slice). */
export function guardParkedLines(status: IKernelSliceStatus | null, now: number): string[] {
  if (!status || !status.in_slice || status.error !== undefined) {
    return [];
  }
  const parked = status.guard?.parked;
  if (!Array.isArray(parked)) {
    return [];
  }
  return parked
    .filter(r => r !== null && typeof r === 'object' && typeof r.pid === 'number')
    .map(r => guardParkedText(r, now));
}

/** The status bar item's class while the guard sees a GPU of the kernel's slice over its cap. */
export const GUARD_OVER_CLASS = 'hami-guard-over';

/** GUARD_OVER_CLASS when the guard sees the slice over its cap (guardOverLines), else `null`. */
export function statusGuardClass(status: IKernelSliceStatus | null): string | null {
  return guardOverLines(status).length > 0 ? GUARD_OVER_CLASS : null;
}

/**
 * `"guaranteed 2.0 GiB of the 8.0 GiB cap"` for a GPU whose guarantee is below
 * its cap (`"guaranteed 4.0 GiB, no cap"` without a cap), the words of `%hami
 * status`; `null` where the guarantee is the cap (none set, as without
 * oversubscription) or the server sends none (older servers).
 */
export function guaranteeText(gpu: IGpuStatus): string | null {
  const guarantee = gpu.memory_guarantee;
  if (typeof guarantee !== 'number' || !Number.isFinite(guarantee)) {
    return null;
  }
  const limit = count(gpu.memory_limit);
  if (count(guarantee) === limit) {
    return null;
  }
  if (limit === 0) {
    return `guaranteed ${formatBytes(guarantee)}, no cap`;
  }
  return `guaranteed ${formatBytes(guarantee)} of the ${formatBytes(limit)} cap`;
}

/** What lies between a guarantee and its cap, for a tooltip. */
export const LENT_TEXT =
  'Above the guarantee, memory is lent: while the GPU is short, idle kernels of this slice may ' +
  'be parked to make room for others (never a running cell).';

/**
 * One line per GPU: `"GPU 0: 1.2 / 4.0 GiB · SM 23 % / 25 %"`; with memory of
 * parked kernels held in host memory
 * `"GPU 0: 1.2 / 4.0 GiB · SM 23 % / 25 % · 8.0 GiB parked"`; where the
 * guard's figure differs from the reported one (realText)
 * `"GPU 0: 1.2 / 4.0 GiB · real 1.4 GiB (guard) · SM 23 % / 25 %"`; where the
 * guarantee is below the cap (guaranteeText)
 * `"GPU 0: 1.2 / 8.0 GiB · guaranteed 2.0 GiB of the 8.0 GiB cap · SM 23 %"`.
 */
export function gpuText(gpu: IGpuStatus): string {
  const parked = count(gpu.memory_parked);
  const real = realText(gpu);
  const guaranteed = guaranteeText(gpu);
  return (
    `GPU ${gpu.index}: ${formatMemory(count(gpu.memory_used), count(gpu.memory_limit))}` +
    (real !== null ? ` · ${real}` : '') +
    (guaranteed !== null ? ` · ${guaranteed}` : '') +
    ` · ${formatSM(count(gpu.sm_util), count(gpu.sm_share))}` +
    (parked > 0 ? ` · ${formatBytes(parked)} parked` : '')
  );
}

/**
 * One line per GPU of the status whose use is over its cap (a cap lowered
 * below what the slice holds): `"Over the cap on GPU 0: 864 MiB in use of the
 * 512 MiB cap; new allocations are refused until use falls below it"`. Empty
 * when no GPU is over (at the cap is not over it), outside a slice and for an
 * unreadable slice file.
 */
export function overCapLines(status: IKernelSliceStatus | null): string[] {
  if (!status || !status.in_slice || status.error !== undefined) {
    return [];
  }
  const lines: string[] = [];
  for (const gpu of status.gpus ?? []) {
    const used = count(gpu.memory_used);
    const limit = count(gpu.memory_limit);
    if (limit > 0 && used > limit) {
      lines.push(
        `Over the cap on GPU ${gpu.index}: ${formatBytes(used)} in use of the ${formatBytes(limit)} cap; ` +
          'new allocations are refused until use falls below it'
      );
    }
  }
  return lines;
}

/**
 * The status bar item's tooltip: the slice, its GPUs, a line for each GPU
 * over its cap (overCapLines), the guard's line for each GPU it sees over
 * its cap (guardOverLines), this kernel's share.
 */
export function tooltipText(status: IKernelSliceStatus | null): string {
  if (!status || !status.in_slice) {
    return status?.reason ?? 'Not in a GPU slice';
  }
  const lines = [`GPU slice ${status.slice ?? ''}`.trimEnd()];
  if (status.error !== undefined) {
    lines.push(status.error);
  } else {
    for (const gpu of status.gpus ?? []) {
      lines.push(gpuText(gpu));
    }
    lines.push(...overCapLines(status));
    lines.push(...guardOverLines(status));
    if (status.kernel) {
      const park = parkInfo(status.kernel);
      const own = parkTooltipText(park, parkReasonText(status.kernel));
      lines.push(
        own ??
          `This kernel: ${formatBytes(count(status.kernel.memory_used))}` +
            ` · SM ${formatPercent(count(status.kernel.sm_util))}`
      );
      if (park.wait !== null && (park.state === 'parked' || park.state === 'resuming')) {
        lines.push(`The resume waits for ${park.wait}`);
      }
      const room = roomWaitText(status.kernel.room_wait);
      if (room !== null) {
        lines.push(`This kernel is ${room}`);
      }
    }
  }
  lines.push('Click to show the slice panel');
  return lines.join('\n');
}

/** A kernel's bytes per GPU UUID, summed over its processes (`processes[].memory_used`). */
export function kernelGpuBytes(kernel: ISliceKernel): Map<string, number> {
  const bytes = new Map<string, number>();
  for (const process of kernel.processes ?? []) {
    const used = (process as { memory_used?: unknown } | null)?.memory_used;
    if (typeof used !== 'object' || used === null) {
      continue;
    }
    for (const [uuid, n] of Object.entries(used as Record<string, unknown>)) {
      bytes.set(uuid, (bytes.get(uuid) ?? 0) + count(n));
    }
  }
  return bytes;
}

/**
 * The GPU of the status where `kernel` holds the most memory (its processes'
 * bytes by UUID); `null` while it holds none there (parked, not started on a
 * GPU, or an older server without per-process figures).
 */
export function kernelGpu(kernel: ISliceKernel, status: IKernelSliceStatus | null): IGpuStatus | null {
  let best: IGpuStatus | null = null;
  let most = 0;
  const bytes = kernelGpuBytes(kernel);
  for (const gpu of status?.gpus ?? []) {
    const held = gpu.uuid !== undefined ? (bytes.get(gpu.uuid) ?? 0) : 0;
    if (held > most) {
      best = gpu;
      most = held;
    }
  }
  return best;
}

/**
 * The GPUs of the status where `kernel` holds memory, with its bytes on each,
 * in the status's order; empty while it holds none (or from an older server
 * without per-process figures).
 */
export function kernelSplit(
  kernel: ISliceKernel,
  status: IKernelSliceStatus | null
): Array<{ gpu: IGpuStatus; used: number }> {
  const bytes = kernelGpuBytes(kernel);
  const found: Array<{ gpu: IGpuStatus; used: number }> = [];
  for (const gpu of status?.gpus ?? []) {
    const used = gpu.uuid !== undefined ? (bytes.get(gpu.uuid) ?? 0) : 0;
    if (used > 0) {
      found.push({ gpu, used });
    }
  }
  return found;
}

/** What a kernel's memory cell of the panel shows beside its figure (kernelMemoryView). */
export interface IKernelMemoryView {
  /** Its level against the cap of its GPU, by the status's thresholds: a colour only from warning on. */
  level: Level;
  /** The tooltip: `"65 % of GPU 1's cap"`, `"65 % of the slice's cap"`; `""` without a cap. */
  title: string;
}

/**
 * A kernel's memory against the cap of the GPU it holds the most on
 * (kernelGpu; else the slice's fullest GPU, memoryHeadline): its level by the
 * status's thresholds (a kernel at 48 % is no warning, whatever its rank) and
 * the tooltip naming that GPU where the slice has several.
 */
export function kernelMemoryView(kernel: ISliceKernel, status: IKernelSliceStatus | null): IKernelMemoryView {
  const split = kernelSplit(kernel, status);
  if (split.length > 1) {
    // On several GPUs: each against its own cap, the level the worst of them.
    let level: Level = 'ok';
    const parts = split.map(({ gpu, used }) => {
      const fraction = memoryFraction(used, gpuCap(gpu));
      if (fraction === null) {
        return `GPU ${gpu.index}: ${formatBytes(used)}, no cap`;
      }
      level = worseLevel(level, memoryLevel(used, gpuCap(gpu), statusThresholds(status)));
      return `GPU ${gpu.index}: ${formatBytes(used)}, ${formatPercent(fraction * 100)} of its cap`;
    });
    return { level, title: parts.join(' · ') };
  }
  const own = kernelGpu(kernel, status);
  const headline = memoryHeadline(status);
  const gpuCount = status?.gpus?.length ?? 0;
  const used = own?.uuid !== undefined ? (kernelGpuBytes(kernel).get(own.uuid) ?? 0) : count(kernel.memory_used);
  const limit = own !== null ? gpuCap(own) : (headline?.limit ?? 0);
  const index = own !== null ? own.index : headline?.gpu ?? null;
  const fraction = memoryFraction(used, limit);
  if (fraction === null) {
    return { level: 'ok', title: '' };
  }
  const capName = gpuCount > 1 && index !== null ? `GPU ${index}'s cap` : "the slice's cap";
  return {
    level: memoryLevel(used, limit, statusThresholds(status)),
    title: `${formatPercent(fraction * 100)} of ${capName}`
  };
}

/**
 * The panel's headline, the status bar's words (statusText) so the two never
 * disagree; while this notebook's kernel is parked or on its way, `slice` is
 * the slice's own usage (sliceText) for a second line, else `null`.
 */
export function panelHeadline(status: IKernelSliceStatus | null): { text: string | null; slice: string | null } {
  const text = statusText(status);
  const slice = sliceText(status);
  return { text, slice: text !== slice ? slice : null };
}

/** The top of a chart's scale in words: `"1.1 GiB"`, `"100 %"`. */
export function scaleText(max: number, kind: 'memory' | 'sm'): string {
  return kind === 'memory' ? formatBytes(max) : formatPercent(max);
}

/**
 * The slice's kernels for the panel, biggest memory user first (the one that
 * hogs the slice on top), then by SM use, then by id so the order is stable.
 */
export function sortKernels(kernels: readonly ISliceKernel[]): ISliceKernel[] {
  return [...kernels].sort(
    (a, b) =>
      count(b.memory_used) - count(a.memory_used) ||
      count(b.sm_util) - count(a.sm_util) ||
      (a.kernel_id < b.kernel_id ? -1 : a.kernel_id > b.kernel_id ? 1 : 0)
  );
}

/* Parking: an idle kernel's GPU memory moved to host memory. */

export const PARK_STATES: readonly ParkState[] = ['running', 'parking', 'parked', 'resuming'];

/** A kernel's parking fields, read so that an older server's answer (none of them) means running. */
export interface IParkInfo {
  /** `running` when missing or not one of PARK_STATES. */
  state: ParkState;
  /** Bytes in host memory; 0 when missing or not a number. */
  parked: number;
  /** What a resume waits for; `null` when missing, null or blank. */
  wait: string | null;
}

/** The parking fields of the status's `kernel` or of an entry of `kernels[]`. */
export function parkInfo(fields: IParkFields | null | undefined): IParkInfo {
  const state = fields?.park_state;
  const wait = fields?.park_wait;
  return {
    state:
      typeof state === 'string' && (PARK_STATES as readonly string[]).includes(state)
        ? state
        : 'running',
    parked: count(fields?.memory_parked),
    wait: typeof wait === 'string' && wait.trim() !== '' ? wait.trim() : null
  };
}

/**
 * Why a parked kernel was parked, in words (PARK_REASON_WORDS): `"to make room
 * for another user's work"`; `null` while it is not parked, and for a reason
 * the server does not send or this extension does not know.
 */
export function parkReasonText(fields: IParkFields | null | undefined): string | null {
  const reason = fields?.park_reason;
  if (parkInfo(fields).state !== 'parked' || typeof reason !== 'string') {
    return null;
  }
  return Object.prototype.hasOwnProperty.call(PARK_REASON_WORDS, reason) ? PARK_REASON_WORDS[reason] : null;
}

/**
 * Why a kernel was parked, by the reason the server sends (`park_reason`), in
 * the words of `%hami status`.
 */
export const PARK_REASON_WORDS: Readonly<Record<string, string>> = Object.freeze({
  idle: 'while idle',
  asked: 'on request',
  room: "to make room for another user's work",
  guard: "by the guard (over the cap by the driver's figures)"
});

/**
 * `"waiting for 8.0 GiB of GPU room since 14:02"` for a wait for room on a
 * full GPU (the memory broker makes it by parking idle kernels); `null`
 * without one (or from an older server).
 */
export function roomWaitText(wait: IRoomWait | null | undefined): string | null {
  if (wait === null || typeof wait !== 'object') {
    return null;
  }
  const since = wait.since_unix;
  const when = typeof since === 'number' && Number.isFinite(since) && since > 0 ? ` since ${clockText(since)}` : '';
  return `waiting for ${formatBytes(count(wait.bytes))} of GPU room${when}`;
}

export const PARKING_TEXT = 'vGPU parking…';
export const RESUMING_TEXT = 'vGPU resuming…';

/**
 * The status bar text of a kernel that is not running:
 * `"vGPU parked · 8.0 GiB in host memory"` (`"vGPU parked"` with nothing in
 * host memory), `"vGPU parking…"`, `"vGPU resuming…"`; `null` while it runs.
 */
export function parkStatusText(park: IParkInfo): string | null {
  switch (park.state) {
    case 'parked':
      return park.parked > 0 ? `vGPU parked · ${formatBytes(park.parked)} in host memory` : 'vGPU parked';
    case 'parking':
      return PARKING_TEXT;
    case 'resuming':
      return RESUMING_TEXT;
    default:
      return null;
  }
}

/** The status bar item's class while the kernel is parked or parking. */
export const PARKED_CLASS = 'hami-parked';
/** The status bar item's class while the kernel's memory comes back. */
export const RESUMING_CLASS = 'hami-resuming';
export const PARK_CLASSES: readonly string[] = [PARKED_CLASS, RESUMING_CLASS];

/**
 * The status bar item's class for the current kernel's parking (a neutral
 * look, instead of the memory level's colours): PARKED_CLASS while parked or
 * parking, RESUMING_CLASS while resuming; `null` while running, outside a
 * slice, for an unreadable slice file and before any answer.
 */
export function statusParkClass(status: IKernelSliceStatus | null): string | null {
  if (!status || !status.in_slice || status.error !== undefined) {
    return null;
  }
  switch (parkInfo(status.kernel).state) {
    case 'parked':
    case 'parking':
      return PARKED_CLASS;
    case 'resuming':
      return RESUMING_CLASS;
    default:
      return null;
  }
}

/** The tooltip's line for this kernel while it is not running; `null` while it runs. */
function parkTooltipText(park: IParkInfo, why: string | null = null): string | null {
  const bytes = formatBytes(park.parked);
  switch (park.state) {
    case 'parked':
      return (
        `This kernel: parked${why !== null ? ` ${why}` : ''}, ${bytes} in host memory; ` +
        'it comes back before the next cell'
      );
    case 'parking':
      return `This kernel: parking, ${bytes} in host memory so far`;
    case 'resuming':
      return `This kernel: resuming, ${bytes} coming back from host memory`;
    default:
      return null;
  }
}

/**
 * The park line of a kernel's row in the panel; `null` while it runs:
 * `"parked: 8.0 GiB in host memory"`, with why when the server says
 * `"parked to make room for another user's work: 8.0 GiB in host memory"`,
 * with what a resume waits for
 * `"parked: 8.0 GiB in host memory · resume waits for free memory on the GPU"`;
 * `"resuming: 8.0 GiB in host memory"` (and what it waits for);
 * `"parking: 3.0 GiB in host memory so far"`, or `"parking…"` before any.
 */
export function kernelParkText(kernel: IParkFields | null | undefined): string | null {
  const park = parkInfo(kernel);
  const bytes = formatBytes(park.parked);
  const wait = park.wait !== null ? ` · resume waits for ${park.wait}` : '';
  const why = parkReasonText(kernel);
  switch (park.state) {
    case 'parked':
      return `parked${why !== null ? ` ${why}` : ''}: ${bytes} in host memory${wait}`;
    case 'resuming':
      return `resuming: ${bytes} in host memory${wait}`;
    case 'parking':
      return park.parked > 0 ? `parking: ${bytes} in host memory so far` : 'parking…';
    default:
      return null;
  }
}

/**
 * The note under a kernel in the panel: its park line (kernelParkText) and its
 * wait for GPU room (roomWaitText), joined by " · "; `null` when it has
 * neither (running, not waiting).
 */
export function kernelNoteText(kernel: IParkFields | null | undefined): string | null {
  const parts = [kernelParkText(kernel), roomWaitText(kernel?.room_wait)].filter(
    (t): t is string => t !== null
  );
  return parts.length > 0 ? parts.join(' · ') : null;
}

export type ParkAction = 'park' | 'resume';

/**
 * The parking button a kernel's row gets: `park` for a running kernel of this
 * server that holds GPU memory, `resume` for a parked one of this server;
 * `null` otherwise (another server's kernel, nothing to park, or on its way).
 */
export function parkAction(kernel: ISliceKernel): ParkAction | null {
  if (kernel.this_server !== true) {
    return null;
  }
  const state = parkInfo(kernel).state;
  if (state === 'running' && count(kernel.memory_used) > 0) {
    return 'park';
  }
  return state === 'parked' ? 'resume' : null;
}

/** Seconds with one decimal: `1.25` -> `"1.3 s"`. */
function formatSeconds(seconds: number): string {
  return `${count(seconds).toFixed(1)} s`;
}

/**
 * The panel's notice after a park: `"Parked analysis.ipynb: 8.0 GiB moved to
 * host memory in 1.2 s"`; *name* is the kernel's (kernelName), its short id
 * without one.
 */
export function parkResultText(result: IParkResult, name?: string): string {
  return (
    `Parked ${name ?? shortId(result.kernel_id)}: ${formatBytes(result.parked_bytes)}` +
    ` moved to host memory in ${formatSeconds(result.seconds)}`
  );
}

/** The panel's notice after a resume: `"Resumed analysis.ipynb: 8.0 GiB back on the GPU in 0.8 s"`. */
export function resumeResultText(result: IResumeResult, name?: string): string {
  return (
    `Resumed ${name ?? shortId(result.kernel_id)}: ${formatBytes(result.restored_bytes)}` +
    ` back on the GPU in ${formatSeconds(result.seconds)}`
  );
}

/** The panel's notice when a park or resume fails: `"Cannot park analysis.ipynb: <the server's message>"`. */
export function parkErrorText(action: ParkAction, kernelId: string, message: string, name?: string): string {
  const why = message.trim();
  return `Cannot ${action} ${name ?? shortId(kernelId)}` + (why ? `: ${why}` : '');
}

/* The whole GPU (nvdashboard's figures), beside the slice's own. */

/** Watts as people read them: `"312 W"`; `null` when unknown. */
function watts(value: unknown): string | null {
  return typeof value === 'number' && Number.isFinite(value) && value >= 0 ? `${Math.round(value)} W` : null;
}

/**
 * A whole GPU's line: `"Whole GPU 0 · 45 % busy · 40.1 / 140.0 GiB · 312 /
 * 700 W · 61 °C"`, each figure left out where NVML does not say it (the
 * GPU's name is in wholeGpuTitle).
 */
export function wholeGpuText(gpu: IWholeGpu): string {
  const parts: string[] = [];
  if (typeof gpu.utilization === 'number') {
    parts.push(`${formatPercent(gpu.utilization)} busy`);
  }
  if (typeof gpu.memory_used === 'number') {
    parts.push(formatMemory(gpu.memory_used, count(gpu.memory_total)));
  }
  const power = watts(gpu.power_w);
  if (power !== null) {
    const limit = watts(gpu.power_limit_w);
    parts.push(limit !== null ? `${power.slice(0, -2)} / ${limit}` : power);
  }
  if (typeof gpu.temperature_c === 'number' && Number.isFinite(gpu.temperature_c)) {
    parts.push(`${Math.round(gpu.temperature_c)} °C`);
  }
  return `Whole GPU ${gpu.index} · ` + (parts.length > 0 ? parts.join(' · ') : 'no figures from NVML');
}

/** A whole GPU's tooltip: `"GPU 0, NVIDIA H200 (GPU-5a1f…): as NVML sees it, every process on it"`. */
export function wholeGpuTitle(gpu: IWholeGpu): string {
  const name = typeof gpu.name === 'string' && gpu.name.trim() !== '' ? `, ${gpu.name.trim()}` : '';
  return `GPU ${gpu.index}${name} (${gpu.uuid}): as NVML sees it, every process on it`;
}

/**
 * Who holds a whole GPU's memory: `"this slice 3.5 GiB · bob 1.2 GiB · others
 * 36.6 GiB"`: this slice, each other slice the server's user may read (an
 * administrator: every user's, by name), and the rest NVML sees as one total
 * (other users, processes outside slices, the driver).
 */
export function wholeGpuHolders(gpu: IWholeGpu): string {
  const parts = [`this slice ${formatBytes(count(gpu.slice_used))}`];
  for (const other of Array.isArray(gpu.slices) ? gpu.slices : []) {
    if (other && typeof other.slice === 'string') {
      parts.push(`${other.slice} ${formatBytes(count(other.memory_used))}`);
    }
  }
  if (typeof gpu.others_used === 'number') {
    parts.push(`others ${formatBytes(gpu.others_used)}`);
  }
  return parts.join(' · ');
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/**
 * The server's JSON as an IKernelSliceStatus, or `null` when it is not one (no
 * kernel id or no in_slice flag). Lists that are not lists become empty and
 * entries that are not objects are dropped, so the widgets can trust the shape.
 */
export function parseKernelStatus(json: unknown): IKernelSliceStatus | null {
  if (!isObject(json) || typeof json.kernel_id !== 'string' || typeof json.in_slice !== 'boolean') {
    return null;
  }
  const status = { ...json } as unknown as IKernelSliceStatus;
  if (json.gpus !== undefined) {
    status.gpus = Array.isArray(json.gpus) ? (json.gpus.filter(isObject) as unknown as IGpuStatus[]) : [];
  }
  if (json.kernels !== undefined) {
    status.kernels = Array.isArray(json.kernels)
      ? (json.kernels.filter(
          k => isObject(k) && typeof k.kernel_id === 'string'
        ) as unknown as ISliceKernel[])
      : [];
  }
  if (json.whole_gpus !== undefined) {
    status.whole_gpus = Array.isArray(json.whole_gpus)
      ? (json.whole_gpus.filter(
          w => isObject(w) && typeof w.index === 'number' && typeof w.uuid === 'string'
        ) as unknown as IWholeGpu[])
      : [];
  }
  if (json.error !== undefined && typeof json.error !== 'string') {
    status.error = String(json.error);
  }
  return status;
}

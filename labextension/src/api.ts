/**
 * Parking a kernel and resuming it: `POST {baseUrl}hami/v1/kernels/<id>/park`
 * and `.../resume` of the server extension. Authenticated as the status
 * polls are (ServerConnection.makeRequest: the token, jupyter_server's XSRF
 * cookie).
 */

import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import { IKeptHistory } from './history';
import { IParkResult, IResumeResult } from './types';

/** The REST path of one kernel's slice, under the server's base URL. */
export const KERNEL_API_PATH = 'hami/v1/kernels';

/**
 * A park or resume the server refused or could not finish (409: it cannot,
 * 504: no room came in time, 404: unknown kernel). `message` is the server's
 * own (the `message` of jupyter_server's JSON error body), or says the HTTP
 * status when the body carries none.
 */
export class ParkError extends Error {
  constructor(message: string, readonly status: number) {
    super(message);
    this.name = 'ParkError';
  }
}

/** The message of jupyter_server's JSON error body, or `null` when the body has none. */
export function errorMessage(body: string): string | null {
  let json: unknown;
  try {
    json = JSON.parse(body);
  } catch {
    return null;
  }
  if (typeof json === 'object' && json !== null && !Array.isArray(json)) {
    const message = (json as Record<string, unknown>).message;
    if (typeof message === 'string' && message.trim() !== '') {
      return message.trim();
    }
  }
  return null;
}

async function post(
  settings: ServerConnection.ISettings,
  kernelId: string,
  verb: 'park' | 'resume'
): Promise<Record<string, unknown>> {
  const url = URLExt.join(settings.baseUrl, KERNEL_API_PATH, encodeURIComponent(kernelId), verb);
  const response = await ServerConnection.makeRequest(url, { method: 'POST' }, settings);
  const body = await response.text();
  if (!response.ok) {
    const http = `HTTP ${response.status}${response.statusText ? ` ${response.statusText}` : ''}`;
    throw new ParkError(errorMessage(body) ?? http, response.status);
  }
  let json: unknown;
  try {
    json = JSON.parse(body);
  } catch {
    json = null;
  }
  if (
    typeof json !== 'object' ||
    json === null ||
    Array.isArray(json) ||
    typeof (json as Record<string, unknown>).kernel_id !== 'string'
  ) {
    throw new Error(`the server's answer to ${verb} is not JSON with a kernel_id`);
  }
  return json as Record<string, unknown>;
}

/**
 * Parks a kernel now: its GPU memory goes to host memory. Resolves to the
 * server's answer; rejects with a ParkError carrying the server's message
 * when it cannot (e.g. host memory too low, nothing to park).
 */
export async function parkKernel(
  settings: ServerConnection.ISettings,
  kernelId: string
): Promise<IParkResult> {
  return (await post(settings, kernelId, 'park')) as unknown as IParkResult;
}

/**
 * Brings a parked kernel's memory back to the GPU now. Resolves to the
 * server's answer; rejects with a ParkError carrying the server's message
 * when it cannot, or when no room came in time (504: the kernel stays parked).
 */
export async function resumeKernel(
  settings: ServerConnection.ISettings,
  kernelId: string
): Promise<IResumeResult> {
  return (await post(settings, kernelId, 'resume')) as unknown as IResumeResult;
}

/** The server's history of a kernel's slice: `GET .../kernels/<id>/history`. */
export interface IHistoryAnswer extends IKeptHistory {
  kernel_id: string;
  in_slice: boolean;
  /** The slice file's path, as the status's `path`. */
  path?: string;
  /** Seconds between the server's samples. */
  interval_s: number;
}

/**
 * The last `minutes` the server kept of kernel `kernelId`'s slice (its charts'
 * samples, history.ts). Rejects when the server has none to give (an older
 * server answers 404) or answers something else.
 */
export async function fetchHistory(
  settings: ServerConnection.ISettings,
  kernelId: string,
  minutes: number
): Promise<IHistoryAnswer> {
  const url =
    URLExt.join(settings.baseUrl, KERNEL_API_PATH, encodeURIComponent(kernelId), 'history') +
    URLExt.objectToQueryString({ minutes: String(Math.round(minutes)) });
  const response = await ServerConnection.makeRequest(url, {}, settings);
  if (!response.ok) {
    throw new ServerConnection.ResponseError(response);
  }
  const json = (await response.json()) as IHistoryAnswer;
  if (typeof json !== 'object' || json === null || typeof json.interval_s !== 'number') {
    throw new Error('the server answered something that is not a slice history');
  }
  return json;
}

// The model against a fake server: the thresholds come from each answer.
import { ServerConnection } from '@jupyterlab/services';

import { DEFAULT_THRESHOLDS, GIB } from '../src/format';
import { SliceModel } from '../src/model';
import { IKernelSliceStatus } from '../src/types';

/** What the fake server answers for kernel k1: a 10 GiB slice using `used` bytes. */
function answer(used: number, fractions: Record<string, unknown>): IKernelSliceStatus {
  return {
    kernel_id: 'k1',
    in_slice: true,
    slice: 'alice',
    path: '/run/hami/slices/alice.slice',
    memory_used: used,
    memory_limit: 10 * GIB,
    memory_level: 'ok',
    sm_share: 0,
    sm_util: 0,
    gpus: [
      {
        index: 0,
        memory_total: 80 * GIB,
        memory_used: used,
        memory_limit: 10 * GIB,
        sm_share: 0,
        sm_util: 0
      }
    ],
    kernels: [],
    ...fractions
  } as IKernelSliceStatus;
}

/** The models' clock (their history's time), ms since the epoch; the tests move it. */
let clock = 1_700_000_000_000;

/**
 * A model whose requests go to `reply` (a JSON body, or an HTTP status to fail
 * with); those for a slice's history to `history` (404 by default: an older
 * server), kept apart in `histories`.
 */
function fakeServer(
  reply: () => unknown,
  history: () => unknown = () => 404
): { model: SliceModel; paths: string[]; histories: string[] } {
  const paths: string[] = [];
  const histories: string[] = [];
  const fetch = async (request: Request): Promise<Response> => {
    const url = new URL(request.url);
    const asksHistory = url.pathname.endsWith('/history');
    if (asksHistory) {
      histories.push(`${url.pathname}?minutes=${url.searchParams.get('minutes')}`);
    } else {
      paths.push(url.pathname);
    }
    const body = asksHistory ? history() : reply();
    if (typeof body === 'number') {
      return new Response('failed', { status: body });
    }
    return new Response(JSON.stringify(body), {
      status: 200,
      headers: { 'Content-Type': 'application/json' }
    });
  };
  const serverSettings = ServerConnection.makeSettings({
    baseUrl: 'http://localhost:8888/',
    wsUrl: 'ws://localhost:8888/',
    token: '',
    fetch: fetch as typeof globalThis.fetch
  });
  // The poll's timers are fake and never reach the interval: only the
  // refreshes of the tests ask the server.
  const model = new SliceModel({ serverSettings, refreshRate: 60_000, now: () => clock });
  return { model, paths, histories };
}

/** Runs the poll's due timers and the requests they make until `done` holds. */
async function until(model: SliceModel, done: (model: SliceModel) => boolean): Promise<void> {
  for (let i = 0; i < 50; i++) {
    if (done(model)) {
      return;
    }
    await jest.advanceTimersByTimeAsync(0);
  }
  throw new Error('the model never got there');
}

/** Asks the server again (as showing the panel does) once the poll is idle, until `done`. */
async function refreshUntil(model: SliceModel, done: (model: SliceModel) => boolean): Promise<void> {
  // A refresh while the last one is still under way would be dropped.
  await jest.advanceTimersByTimeAsync(0);
  void model.refresh();
  await until(model, done);
}

describe('the model', () => {
  let model: SliceModel | null = null;

  beforeEach(() => {
    jest.useFakeTimers({ doNotFake: ['setImmediate', 'nextTick', 'queueMicrotask'] });
  });

  afterEach(() => {
    model?.dispose();
    model = null;
    // The poll leaves its next tick scheduled after dispose: drop it.
    jest.clearAllTimers();
    jest.useRealTimers();
  });

  it('follows the thresholds of each answer', async () => {
    let reply: unknown = answer(6 * GIB, { warning_fraction: 0.5, critical_fraction: 0.7 });
    const server = fakeServer(() => reply);
    model = server.model;
    expect(model.thresholds).toEqual(DEFAULT_THRESHOLDS); // no answer yet
    expect(model.level).toBeNull();

    let changes = 0;
    model.changed.connect(() => changes++);
    model.kernelId = 'k1';
    await until(model, m => m.status !== null);
    expect(server.paths).toEqual(['/hami/v1/kernels/k1']);
    expect(model.thresholds).toEqual({ warning: 0.5, critical: 0.7 });
    expect(model.level).toBe('warning'); // 60 %

    // The same 60 % once the server's thresholds are 0.8 / 0.95: ok.
    reply = answer(6 * GIB, { warning_fraction: 0.8, critical_fraction: 0.95 });
    const before = changes;
    await refreshUntil(model, m => m.status?.warning_fraction === 0.8);
    expect(changes).toBeGreaterThan(before); // the widgets re-render
    expect(model.thresholds).toEqual({ warning: 0.8, critical: 0.95 });
    expect(model.level).toBe('ok');

    // And critical once they are 0.4 / 0.6.
    reply = answer(6 * GIB, { warning_fraction: 0.4, critical_fraction: 0.6 });
    await refreshUntil(model, m => m.status?.warning_fraction === 0.4);
    expect(model.level).toBe('critical');
    expect(server.paths).toHaveLength(3);
  });

  it('falls back to the defaults for unusable thresholds, keeps the last ones while a poll fails', async () => {
    let reply: unknown = answer(8.5 * GIB, { warning_fraction: 'high', critical_fraction: 2 });
    const server = fakeServer(() => reply);
    model = server.model;
    model.kernelId = 'k1';
    await until(model, m => m.status !== null);
    expect(model.thresholds).toEqual(DEFAULT_THRESHOLDS);
    expect(model.level).toBe('warning'); // 85 % with 0.8 / 0.95

    reply = answer(8.5 * GIB, { warning_fraction: 0.9, critical_fraction: 0.95 });
    await refreshUntil(model, m => m.status?.warning_fraction === 0.9);
    expect(model.level).toBe('ok'); // 85 % with 0.9 / 0.95

    // A failing poll leaves the last answer, and so its thresholds, shown.
    reply = 500;
    await refreshUntil(model, m => m.error !== null);
    expect(model.thresholds).toEqual({ warning: 0.9, critical: 0.95 });
    expect(model.level).toBe('ok');
  });

  it('uses the defaults outside a slice and drops the thresholds of the last kernel', async () => {
    let reply: unknown = answer(6 * GIB, { warning_fraction: 0.5, critical_fraction: 0.7 });
    const server = fakeServer(() => reply);
    model = server.model;
    model.kernelId = 'k1';
    await until(model, m => m.status !== null);
    expect(model.thresholds.warning).toBe(0.5);

    await jest.advanceTimersByTimeAsync(0);
    reply = {
      kernel_id: 'k2',
      in_slice: false,
      reason: 'not HAMi',
      warning_fraction: 0.5,
      critical_fraction: 0.7
    };
    model.kernelId = 'k2';
    expect(model.thresholds).toEqual(DEFAULT_THRESHOLDS); // k1's answer is gone at once
    await until(model, m => m.status !== null);
    expect(server.paths).toEqual(['/hami/v1/kernels/k1', '/hami/v1/kernels/k2']);
    expect(model.inSlice).toBe(false);
    expect(model.thresholds).toEqual(DEFAULT_THRESHOLDS);
    expect(model.level).toBeNull();
  });

  it('keeps each answer in its history, and a gap where the server did not answer', async () => {
    const start = clock;
    let reply: unknown = answer(2 * GIB, {});
    const server = fakeServer(() => reply);
    model = server.model;
    expect(model.historyMinutes).toBe(5);
    expect(model.history.windowMs).toBe(5 * 60_000);
    expect(model.maxGapMs).toBe(3 * 60_000); // three refresh intervals
    model.kernelId = 'k1';
    await until(model, m => m.status !== null);

    clock += 1000;
    reply = 500;
    await refreshUntil(model, m => m.error !== null);

    clock += 1000;
    reply = answer(3 * GIB, {});
    await refreshUntil(model, m => m.error === null && m.status?.memory_used === 3 * GIB);

    expect(model.history.slice).toBe('/run/hami/slices/alice.slice');
    expect(model.history.gpu('0').map(s => [s.t - start, s.gap, s.used])).toEqual([
      [0, false, 2 * GIB],
      [1000, true, null],
      [2000, false, 3 * GIB]
    ]);

    // The setting resizes the window, and the widgets hear of it.
    let changes = 0;
    model.changed.connect(() => changes++);
    model.historyMinutes = 10;
    expect(model.history.windowMs).toBe(10 * 60_000);
    expect(changes).toBe(1);
    model.historyMinutes = 0;
    expect(model.historyMinutes).toBe(1);
  });

  it('puts the minutes the server kept in front of its own, once per slice (issue 35, item 6)', async () => {
    const start = clock;
    const sample = (t: number, used: number) => ({
      t,
      gap: false,
      used,
      sm: 0,
      cap: 10 * GIB,
      share: 0,
      real: null,
      parked: 0,
      state: null
    });
    const kept = {
      kernel_id: 'k1',
      in_slice: true,
      path: '/run/hami/slices/alice.slice',
      interval_s: 120,
      gpus: { '0': [sample(start - 4000, GIB), sample(start - 2000, 1.5 * GIB), sample(start, 9 * GIB)] },
      kernels: {}
    };
    const server = fakeServer(
      () => answer(2 * GIB, {}),
      () => kept
    );
    model = server.model;
    let changes = 0;
    model.changed.connect(() => changes++);
    model.kernelId = 'k1';
    await until(model, m => m.history.gpu('0').length === 3);
    expect(server.histories).toEqual(['/hami/v1/kernels/k1/history?minutes=5']);
    // The server's older samples, then the page's own first poll (the server's at its time is not taken).
    expect(model.history.gpu('0').map(s => [s.t - start, s.used])).toEqual([
      [-4000, GIB],
      [-2000, 1.5 * GIB],
      [0, 2 * GIB]
    ]);
    expect(changes).toBeGreaterThanOrEqual(2); // the charts redraw with them
    // Its samples are two minutes apart: lines join across them.
    expect(model.maxGapMs).toBe(3 * 120_000);

    clock += 1000;
    await refreshUntil(model, m => m.history.gpu('0').length === 4);
    expect(server.histories).toHaveLength(1); // asked once for the slice
  });

  it('keeps the history of the slice across its kernels, and nothing of a kernel outside one', async () => {
    let reply: unknown = answer(GIB, {});
    const server = fakeServer(() => reply);
    model = server.model;
    model.kernelId = 'k1';
    await until(model, m => m.status !== null);
    await jest.advanceTimersByTimeAsync(0);

    reply = { kernel_id: 'k2', in_slice: false, reason: 'not HAMi' };
    model.kernelId = 'k2';
    await until(model, m => m.status !== null);
    expect(model.history.gpu('0')).toHaveLength(1);
    await jest.advanceTimersByTimeAsync(0);

    clock += 1000;
    reply = { ...answer(GIB, {}), kernel_id: 'k3' };
    model.kernelId = 'k3';
    await until(model, m => m.status !== null);
    expect(model.history.gpu('0')).toHaveLength(2);
  });
});

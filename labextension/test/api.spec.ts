// Parking and resuming against a fake server: the requests they make, and the
// server's message on the error they throw.
import { ServerConnection } from '@jupyterlab/services';

import { errorMessage, ParkError, parkKernel, resumeKernel } from '../src/api';
import { GIB } from '../src/format';

interface ISeen {
  method: string;
  path: string;
  authorization: string | null;
}

/** Server settings whose requests go to `reply`, which answers with a status and a body. */
function fakeServer(reply: (path: string) => { status: number; body: string }): {
  settings: ServerConnection.ISettings;
  seen: ISeen[];
} {
  const seen: ISeen[] = [];
  const fetch = async (request: Request): Promise<Response> => {
    const path = new URL(request.url).pathname;
    seen.push({ method: request.method, path, authorization: request.headers.get('Authorization') });
    const { status, body } = reply(path);
    return new Response(body, { status, headers: { 'Content-Type': 'application/json' } });
  };
  const settings = ServerConnection.makeSettings({
    baseUrl: 'http://localhost:8888/lab-base/',
    wsUrl: 'ws://localhost:8888/lab-base/',
    token: 'secret',
    fetch: fetch as typeof globalThis.fetch
  });
  return { settings, seen };
}

const json = (status: number, body: unknown) => () => ({ status, body: JSON.stringify(body) });

describe('parking a kernel', () => {
  it('posts to the kernel’s park URL with the token and returns the answer', async () => {
    const answer = { kernel_id: 'k/1', park_state: 'parked', parked_bytes: 8 * GIB, seconds: 1.5 };
    const { settings, seen } = fakeServer(json(200, answer));
    await expect(parkKernel(settings, 'k/1')).resolves.toEqual(answer);
    expect(seen).toEqual([
      { method: 'POST', path: '/lab-base/hami/v1/kernels/k%2F1/park', authorization: 'token secret' }
    ]);
  });

  it('throws the server’s message when it cannot park (409)', async () => {
    const { settings } = fakeServer(json(409, { message: 'host memory too low: 2.0 GiB free, 8.0 GiB needed', reason: null }));
    const error: unknown = await parkKernel(settings, 'k1').catch(e => e);
    expect(error).toBeInstanceOf(ParkError);
    expect((error as ParkError).message).toBe('host memory too low: 2.0 GiB free, 8.0 GiB needed');
    expect((error as ParkError).status).toBe(409);
  });

  it('throws for an unknown kernel (404), with the HTTP status when the body has no message', async () => {
    const { settings } = fakeServer(() => ({ status: 404, body: '<html>Not Found</html>' }));
    const error: unknown = await parkKernel(settings, 'gone').catch(e => e);
    expect(error).toBeInstanceOf(ParkError);
    expect((error as ParkError).status).toBe(404);
    expect((error as ParkError).message).toMatch(/^HTTP 404/);
  });

  it('throws when a 200 answer is not a park result', async () => {
    const { settings } = fakeServer(() => ({ status: 200, body: 'ok' }));
    await expect(parkKernel(settings, 'k1')).rejects.toThrow('not JSON with a kernel_id');
    const other = fakeServer(json(200, [1, 2]));
    await expect(parkKernel(other.settings, 'k1')).rejects.toThrow('not JSON with a kernel_id');
  });
});

describe('resuming a kernel', () => {
  it('posts to the kernel’s resume URL and returns the answer', async () => {
    const answer = { kernel_id: 'k1', park_state: 'running', restored_bytes: 8 * GIB, seconds: 0.4 };
    const { settings, seen } = fakeServer(json(200, answer));
    await expect(resumeKernel(settings, 'k1')).resolves.toEqual(answer);
    expect(seen.map(s => `${s.method} ${s.path}`)).toEqual(['POST /lab-base/hami/v1/kernels/k1/resume']);
  });

  it('throws the server’s message when no room came in time (504)', async () => {
    const { settings } = fakeServer(
      json(504, { message: "no room under the slice's memory cap within 30 s; the kernel stays parked" })
    );
    const error: unknown = await resumeKernel(settings, 'k1').catch(e => e);
    expect(error).toBeInstanceOf(ParkError);
    expect((error as ParkError).status).toBe(504);
    expect((error as ParkError).message).toBe(
      "no room under the slice's memory cap within 30 s; the kernel stays parked"
    );
  });

  it('throws the server’s message when it cannot resume (409)', async () => {
    const { settings } = fakeServer(json(409, { message: 'the kernel is not parked' }));
    await expect(resumeKernel(settings, 'k1')).rejects.toThrow('the kernel is not parked');
  });
});

describe("the server's error message", () => {
  it('is the message of a JSON error body', () => {
    expect(errorMessage('{"message": " nothing to park ", "reason": null}')).toBe('nothing to park');
  });

  it('is null when the body has none', () => {
    expect(errorMessage('')).toBeNull();
    expect(errorMessage('<html></html>')).toBeNull();
    expect(errorMessage('{"message": ""}')).toBeNull();
    expect(errorMessage('{"message": 3}')).toBeNull();
    expect(errorMessage('["message"]')).toBeNull();
    expect(errorMessage('null')).toBeNull();
  });
});

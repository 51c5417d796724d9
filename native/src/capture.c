/*
 * Stream capture, as the hooks must respect it. A stream being captured into
 * a graph runs nothing: an allocation on it is a graph memory node, whose
 * memory comes when the graph runs (graph_memory.c charges it then), so the
 * hooks pass such calls through untouched. And while any thread captures in
 * the global mode, a "capture-unsafe" call from any other thread invalidates
 * that capture: the hooks' own queries (a pool's attributes) run in the
 * relaxed mode, so a program's capture never fails because of them.
 */
#include "hami.h"

typedef CUresult (*capturing_fn)(CUstream, int *);
typedef CUresult (*exchange_fn)(int *);

int hami_stream_capturing(CUstream stream, int per_thread)
{
	capturing_fn fn = per_thread ? HAMI_REAL(capturing_fn, "cuStreamIsCapturing_ptsz")
				     : HAMI_REAL(capturing_fn, "cuStreamIsCapturing");
	int status = 0;
	if (!fn)
		return 0;
	/* An error (the legacy stream while another stream captures, say) is read
	 * as "capturing": the caller then adds nothing of its own, always safe. */
	return fn(stream, &status) != CUDA_SUCCESS || status != 0;
}

/* Put this thread in the relaxed capture mode; returns the mode to restore. */
int hami_capture_relaxed_begin(void)
{
	exchange_fn fn = HAMI_REAL(exchange_fn, "cuThreadExchangeStreamCaptureMode");
	int mode = CU_STREAM_CAPTURE_MODE_RELAXED;
	if (!fn || fn(&mode) != CUDA_SUCCESS)
		return -1;
	return mode;
}

void hami_capture_relaxed_end(int previous)
{
	exchange_fn fn = HAMI_REAL(exchange_fn, "cuThreadExchangeStreamCaptureMode");
	if (fn && previous >= 0)
		fn(&previous);
}

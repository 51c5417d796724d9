/*
 * Room for memory the driver takes by itself (docs/preload.md, "When the GPU
 * is full"). Loading a module's code (lazily, at a kernel's first launch),
 * growing a context's local memory for a launch, a new stream or event, a
 * raised context limit, a graph upload, the process's first context: each
 * takes device memory that no hook reserved in the slice (the true-up charges
 * it afterwards). On a full GPU such a call fails with
 * CUDA_ERROR_OUT_OF_MEMORY although the slice is within its limit.
 *
 * Every one of those calls is safe to make again after that refusal: the
 * driver started nothing (a refused launch does not run, a refused load
 * leaves no module). So the hook asks the memory broker for room, as a
 * refused allocation does (room.c), and calls the driver again. How much the
 * driver wanted is not known: the first ask is a guess, and each time the
 * broker's room was not enough the ask doubles, never past what the slice's
 * limit leaves (a slice without a cap: what the GPU's memory leaves). When
 * that is nothing, or the broker made all of it free and the driver still
 * refuses, the error goes to the program. A call refused as "busy" while
 * another process's state moves waits for the move (gpu_busy.c).
 */
#include "hami.h"
#include "oom_words.h"

#define FIRST_ASK (256ull << 20) /* the driver's own needs: code, local memory, pools */
#define REPORT_INTERVAL_NS 1000000000ull

static uint64_t last_report;

static void report_no_room(int sdev, const char *what, uint64_t used, uint64_t limit)
{
	if (!hami_report_due(&last_report, REPORT_INTERVAL_NS))
		return;
	char gpu[HAMI_SLICE_UUID_LEN + 8], a[32], b[32];
	struct hami_oom_words words;
	hami_gpu_name(sdev, gpu, sizeof(gpu));
	hami_oom_words(sdev, &words);
	hami_human(used, a);
	hami_human(limit, b);
	/* Plain words first (oom_words.c), the technical line after. */
	hami_log(HAMI_LOG_ERROR, "not enough GPU memory: this notebook's slice \"%s\" holds %s of its %s "
		 "cap on %s%s, and the CUDA driver needs more to go on (for code it loads and memory it "
		 "works in).", hami_slice_name(), a, b, gpu, words.held);
	hami_oom_advice(&words);
	hami_log(HAMI_LOG_ERROR, "out of memory on %s: no room in the slice for what the driver needs for "
		 "%s; slice \"%s\" has %s of its %s cap in use (CUDA contexts included).",
		 gpu, what, hami_slice_name(), a, b);
}

static void report_still_refused(int sdev, const char *what, uint64_t made)
{
	if (!hami_report_due(&last_report, REPORT_INTERVAL_NS))
		return;
	char gpu[HAMI_SLICE_UUID_LEN + 8], a[32];
	hami_gpu_name(sdev, gpu, sizeof(gpu));
	hami_log(HAMI_LOG_ERROR, "out of memory on %s: the driver still refused %s after the memory broker "
		 "made %s free (all that the slice's cap leaves)", gpu, what, hami_human(made, a));
}

int hami_driver_room_wait(struct hami_driver_room *d, int sdev, uint64_t first_ask, const char *what)
{
	if (!hami_slice())
		return 0;
	if (d->sdev < 0) {
		d->sdev = sdev >= 0 ? sdev : hami_current_device(NULL);
		if (d->sdev < 0)
			return 0;
	}
	uint64_t limit = hami_device_limit_bytes(d->sdev);
	uint64_t used = hami_device_used(d->sdev);
	/* Without a cap the GPU's own size bounds what the driver can want. */
	uint64_t bound = limit ? limit : hami_slice()->device[d->sdev].memory_total;
	uint64_t left = bound > used ? bound - used : 0;
	uint64_t ask = !d->ask ? (first_ask ? first_ask : FIRST_ASK) : d->ask > left / 2 ? left : d->ask * 2;
	if (ask > left)
		ask = left;
	if (!ask || ask <= d->ask) {
		if (!d->ask)
			report_no_room(d->sdev, what, used, bound);
		else
			report_still_refused(d->sdev, what, d->ask);
		return 0;
	}
	d->ask = ask;
	return hami_room_wait(&d->room, d->sdev, ask, what, NULL);
}

int hami_driver_room_again(struct hami_driver_room *d, CUresult rc, int sdev, uint64_t first_ask, const char *what)
{
	if (rc == CUDA_ERROR_OUT_OF_MEMORY)
		return hami_driver_room_wait(d, sdev, first_ask, what);
	if (rc == CUDA_ERROR_DEVICE_UNAVAILABLE)
		return hami_busy_wait(&d->room.busy, sdev, -1, what);
	return 0;
}

void hami_driver_room_end(struct hami_driver_room *d)
{
	hami_room_end(&d->room);
	d->sdev = -1;
	d->ask = 0;
}

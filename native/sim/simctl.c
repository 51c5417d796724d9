/*
 * hami-simctl: look at and manage a simulated GPU's state file.
 *
 *   hami-simctl [--state PATH] status       JSON: devices, live processes (memory,
 *                                           contexts, NVDEC decoders and frames,
 *                                           checkpoint state and host bytes, graph
 *                                           pool and driver-internal bytes, graphics)
 *   hami-simctl [--state PATH] busy         JSON: each device's busy ns in each
 *                                           50-ms slot of the last 10 s (the GPU's
 *                                           own record, whoever queued the work)
 *   hami-simctl [--state PATH] reset-peak   peak_used := used, every device
 *   hami-simctl [--state PATH] reset        new state file (none may use it)
 *
 * PATH defaults to $HAMI_SIM_STATE, then /tmp/hami-sim-<uid>/state. A missing
 * file is created from the HAMI_SIM_* variables, as the libraries would.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sim_state.h"

static void usage(FILE *f)
{
	fprintf(f, "usage: hami-simctl [--state PATH] status|busy|reset-peak|reset\n"
		   "  status      print devices and live processes as JSON (dead ones are swept first),\n"
		   "              with each process's checkpoint state and host bytes\n"
		   "  busy        print each device's busy ns in each 50-ms slot of the last 10 s as JSON\n"
		   "              (first_ns: CLOCK_MONOTONIC start of the first slot)\n"
		   "  reset-peak  set every device's peak_used to its current used\n"
		   "  reset       replace the state file with a fresh one; refused while a live\n"
		   "              process uses it\n"
		   "PATH defaults to $HAMI_SIM_STATE, then /tmp/hami-sim-<uid>/state.\n");
}

static void json_str(const char *s)
{
	putchar('"');
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;
		if (c == '"' || c == '\\')
			printf("\\%c", c);
		else if (c < 0x20)
			printf("\\u%04x", c);
		else
			putchar(c);
	}
	putchar('"');
}

static void json_u64_array(_Atomic uint64_t *v, unsigned n)
{
	putchar('[');
	for (unsigned i = 0; i < n; i++)
		printf("%s%llu", i ? ", " : "", (unsigned long long)atomic_load(&v[i]));
	putchar(']');
}

/* The entry's checkpoint state as status shows it: the steps in progress too. */
static const char *ckpt_name(uint32_t c)
{
	static const char *const names[] = {"running", "locked", "checkpointed", "failed",
					    "checkpointing", "restoring", "locking"};
	return c < sizeof(names) / sizeof(names[0]) ? names[c] : "unknown";
}

static int status(void)
{
	struct sim_state *st = sim_st();
	unsigned ndev = st->hdr.ndev;

	sim_sweep();
	/* "util": the sample NVML's process and device utilization give now. */
	uint64_t end = sim_sample_end(sim_now_ns());
	printf("{\"state\": ");
	json_str(sim_path());
	printf(", \"context_bytes\": %llu, \"ns_per_wave\": %llu, \"module_bytes\": %llu,\n \"devices\": [",
	       (unsigned long long)st->hdr.context_bytes, (unsigned long long)st->hdr.ns_per_wave,
	       (unsigned long long)st->hdr.module_bytes);
	for (unsigned i = 0; i < ndev; i++) {
		struct sim_device *d = &st->dev[i];
		printf("%s\n  {\"index\": %u, \"uuid\": ", i ? "," : "", i);
		json_str(d->uuid);
		printf(", \"name\": ");
		json_str(d->name);
		printf(", \"total\": %llu, \"used\": %llu, \"peak_used\": %llu, \"sm_count\": %u, "
		       "\"busy_until_ns\": %llu, \"busy_total_ns\": %llu, \"utilization\": %u, \"util\": %u, "
		       "\"decoders\": %u, \"frames_decoded\": %llu, \"frames_mapped\": %llu}",
		       (unsigned long long)d->total, (unsigned long long)atomic_load(&d->used),
		       (unsigned long long)atomic_load(&d->peak_used), d->sm_count,
		       (unsigned long long)atomic_load(&d->busy_until_ns),
		       (unsigned long long)atomic_load(&d->busy_total_ns), sim_util_pct(d->util),
		       sim_sample_pct(d->util, end), (unsigned)atomic_load(&d->decoders),
		       (unsigned long long)atomic_load(&d->frames_decoded),
		       (unsigned long long)atomic_load(&d->frames_mapped));
	}
	printf("],\n \"processes\": [");
	int first = 1;
	for (unsigned i = 0; i < SIM_MAX_PROCS; i++) {
		struct sim_proc *p = &st->proc[i];
		if (atomic_load(&p->state) != SIM_PROC_LIVE)
			continue;
		printf("%s\n  {\"pid\": %d, \"entry\": %u, \"alive\": %s, \"used\": ", first ? "" : ",",
		       (int)atomic_load(&p->pid), i, sim_proc_alive(i) ? "true" : "false");
		json_u64_array(p->used, ndev);
		printf(", \"busy_ns\": ");
		json_u64_array(p->busy_ns, ndev);
		printf(", \"util\": [");
		for (unsigned d = 0; d < ndev; d++)
			printf("%s%u", d ? ", " : "", sim_sample_pct(p->util[d], end));
		printf("], \"contexts\": [");
		for (unsigned d = 0; d < ndev; d++)
			printf("%s%u", d ? ", " : "", (unsigned)atomic_load(&p->contexts[d]));
		printf("], \"decoders\": [");
		for (unsigned d = 0; d < ndev; d++)
			printf("%s%u", d ? ", " : "", (unsigned)atomic_load(&p->decoders[d]));
		/* host_bytes: what a checkpoint moved off the devices (parked, per
		 * device), now held in the process's host memory. */
		uint64_t host = 0;
		for (unsigned d = 0; d < ndev; d++)
			host += atomic_load(&p->parked[d]);
		printf("], \"checkpoint\": \"%s\", \"locks\": %u, \"in_flight\": %u, \"host_bytes\": %llu, "
		       "\"parked\": ", ckpt_name(atomic_load(&p->ckpt)), (unsigned)atomic_load(&p->locks),
		       (unsigned)atomic_load(&p->inflight), (unsigned long long)host);
		json_u64_array(p->parked, ndev);
		/* Parts of its footprint no allocation returned: the graph memory
		 * pool's reserve and what its driver holds by itself. */
		printf(", \"graph\": ");
		json_u64_array(p->graph, ndev);
		printf(", \"internal\": ");
		json_u64_array(p->internal, ndev);
		printf(", \"graphics\": %s}", atomic_load(&p->graphics) ? "true" : "false");
		first = 0;
	}
	printf("]}\n");
	return fflush(stdout) == 0 ? 0 : 1;
}

/* Complete slots "busy" prints: 10 s, well inside what the ring keeps. */
#define BUSY_HISTORY_SLOTS 200u

/* Each device's busy time per 50-ms slot, the newest complete slot last: a
 * record of what the GPU ran, at a finer grain than NVML's 200-ms samples
 * (tests read the share a slice got in 100-ms windows from it). */
static int busy(void)
{
	struct sim_state *st = sim_st();
	uint64_t cur = sim_now_ns() / SIM_UTIL_SLOT_NS;
	uint64_t first = cur > BUSY_HISTORY_SLOTS ? cur - BUSY_HISTORY_SLOTS : 0;
	printf("{\"slot_ns\": %llu, \"first_ns\": %llu, \"devices\": [", (unsigned long long)SIM_UTIL_SLOT_NS,
	       (unsigned long long)(first * SIM_UTIL_SLOT_NS));
	for (unsigned d = 0; d < st->hdr.ndev; d++) {
		printf("%s[", d ? ", " : "");
		for (uint64_t slot = first; slot < cur; slot++)
			printf("%s%llu", slot > first ? ", " : "",
			       (unsigned long long)sim_slot_busy(st->dev[d].util, slot));
		putchar(']');
	}
	printf("]}\n");
	return fflush(stdout) == 0 ? 0 : 1;
}

static int reset_peak(void)
{
	struct sim_state *st = sim_st();
	sim_sweep();
	for (unsigned i = 0; i < st->hdr.ndev; i++) {
		struct sim_device *d = &st->dev[i];
		atomic_store(&d->peak_used, atomic_load(&d->used));
		/* A charge that raced the store must still show. */
		uint64_t u = atomic_load(&d->used), pk = atomic_load(&d->peak_used);
		while (pk < u && !atomic_compare_exchange_weak(&d->peak_used, &pk, u))
			;
	}
	return 0;
}

/* Only files that say they are ours may be removed when they cannot be used. */
static int looks_like_state(const char *path)
{
	char magic[7];
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	ssize_t n = read(fd, magic, sizeof(magic));
	close(fd);
	return n == (ssize_t)sizeof(magic) && memcmp(magic, SIM_MAGIC, sizeof(magic)) == 0;
}

static int reset(const char *path)
{
	int r = sim_open(path);
	if (r == SIM_OK) {
		struct sim_state *st = sim_st();
		int busy = 0;
		sim_sweep();
		for (unsigned i = 0; i < SIM_MAX_PROCS; i++) {
			if (atomic_load(&st->proc[i].state) == SIM_PROC_LIVE && sim_proc_alive(i)) {
				if (!busy)
					fprintf(stderr, "hami-simctl: %s is in use by live process(es):", sim_path());
				fprintf(stderr, " %d", (int)atomic_load(&st->proc[i].pid));
				busy = 1;
			}
		}
		if (busy) {
			fprintf(stderr, "; not reset\n");
			return 1;
		}
		sim_close();
	} else if (r == SIM_ECONFIG) {
		return 1; /* the variables are wrong, not the file: leave it */
	} else if (!looks_like_state(path)) {
		fprintf(stderr, "hami-simctl: not resetting %s: it is not a simulated GPU state file (remove it by hand if it should go)\n",
			path);
		return 1;
	} else {
		fprintf(stderr, "hami-simctl: replacing unusable state file %s\n", path);
	}
	/* Device memory files of processes long gone would outlive the file. */
	sim_side_clear(path);
	if (unlink(path) < 0 && errno != ENOENT) {
		fprintf(stderr, "hami-simctl: cannot remove %s: %s\n", path, strerror(errno));
		return 1;
	}
	if (sim_open(path) != SIM_OK) {
		fprintf(stderr, "hami-simctl: cannot create %s\n", path);
		return 1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	const char *path = NULL, *cmd = NULL;
	char def[4096];

	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
			usage(stdout);
			return 0;
		} else if (strcmp(a, "--state") == 0) {
			if (++i == argc) {
				fprintf(stderr, "hami-simctl: --state needs a path\n");
				return 2;
			}
			path = argv[i];
		} else if (strncmp(a, "--state=", 8) == 0) {
			path = a + 8;
		} else if (!cmd && a[0] != '-') {
			cmd = a;
		} else {
			fprintf(stderr, "hami-simctl: unexpected argument \"%s\"\n", a);
			usage(stderr);
			return 2;
		}
	}
	if (!cmd) {
		usage(stderr);
		return 2;
	}
	if (path && !*path) {
		fprintf(stderr, "hami-simctl: empty state path\n");
		return 2;
	}
	if (strcmp(cmd, "status") && strcmp(cmd, "busy") && strcmp(cmd, "reset-peak") && strcmp(cmd, "reset")) {
		fprintf(stderr, "hami-simctl: unknown command \"%s\"\n", cmd);
		usage(stderr);
		return 2;
	}
	if (!path && !(path = getenv("HAMI_SIM_STATE"), path && *path)) {
		if (sim_default_path(def, sizeof(def)) != SIM_OK)
			return 1;
		path = def;
	}
	if (strcmp(cmd, "reset") == 0)
		return reset(path);
	int r = sim_open(path);
	if (r != SIM_OK) {
		if (r != SIM_ECONFIG)
			fprintf(stderr, "hami-simctl: cannot use state file %s\n", path);
		return 1;
	}
	if (strcmp(cmd, "busy") == 0)
		return busy();
	return strcmp(cmd, "status") == 0 ? status() : reset_peak();
}

/*
 * The plain words of an out-of-memory refusal (charge.c, driver_room.c): who
 * else in the slice holds memory on the GPU, and what a person can do. A user
 * reads these lines in the notebook's output, before the technical line the
 * caller writes after them (the driver call, the bytes, the cap).
 *
 * Another kernel of the slice is named by its notebook, as JupyterLab names
 * it: its registry entry (<slice file>.kernels/<kernel id>.json, written by
 * the provisioner and the kernel's Jupyter server) says it. That file is the
 * slice user's own: a name to show, never a reason to act. It is read only
 * here, at most once a second (the callers' rate), and anything odd about it
 * (too big, not a regular file, no name) leaves the kernel named by its id.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hami.h"
#include "oom_words.h"

#define ENTRY_MAX 16384  /* a registry entry is a few hundred bytes; more is not one */
#define NAME_MAX_SHOWN 80 /* bytes of a notebook's path in a line */

/* The notebook of kernel *id* from its registry entry, into out (cap bytes):
 * 1 when found, else 0 (out untouched). */
static int notebook_of(const char *id, char *out, size_t cap)
{
	const char *slice = hami_config()->slice_path;
	char path[4096];
	if (!slice || !id[0] || strchr(id, '/') || id[0] == '.')
		return 0;
	int n = snprintf(path, sizeof(path), "%s.kernels/%s.json", slice, id);
	if (n < 0 || (size_t)n >= sizeof(path))
		return 0;
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	if (fd < 0)
		return 0;
	struct stat st;
	char *buf = NULL;
	ssize_t got = -1;
	if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size < ENTRY_MAX && (buf = malloc(ENTRY_MAX)))
		got = read(fd, buf, ENTRY_MAX - 1);
	close(fd);
	if (got <= 0) {
		free(buf);
		return 0;
	}
	buf[got] = 0;
	/* The provisioner writes it with Python's json.dumps: "notebook": "...",
	 * UTF-8 as it is, only a quote and a backslash escaped. */
	const char *key = strstr(buf, "\"notebook\": \"");
	size_t len = 0;
	if (key) {
		for (const char *p = key + strlen("\"notebook\": \""); *p && *p != '"' && len + 1 < cap; p++) {
			if (*p == '\\') {
				p++;
				if (*p != '"' && *p != '\\')
					break; /* an escape this line does not show: the name so far */
			}
			if ((unsigned char)*p < 0x20)
				break;
			out[len++] = *p;
		}
	}
	free(buf);
	if (!len)
		return 0;
	if (len > NAME_MAX_SHOWN) {
		len = NAME_MAX_SHOWN;
		while (len && ((unsigned char)out[len] & 0xc0) == 0x80)
			len--; /* never half a UTF-8 character */
	}
	out[len] = 0;
	return 1;
}

/* The biggest holder on sdev among the slice's other kernels (live slots of
 * another kernel id than ours): its id, its bytes, and how many kernels and
 * bytes in all. Processes outside any kernel count apart. */
struct holders {
	char id[HAMI_SLICE_KERNEL_ID_LEN];
	uint64_t bytes, all_bytes, loose_bytes;
	int kernels;
};

static void other_holders(int sdev, struct holders *h)
{
	struct hami_slice_file *f = hami_slice();
	const char *own = hami_config()->kernel_id;
	int self = hami_slot();
	/* Per kernel id seen, its bytes: a slice has few kernels; the slots are a few hundred. */
	char ids[64][HAMI_SLICE_KERNEL_ID_LEN];
	uint64_t bytes[64];
	int seen = 0;
	memset(h, 0, sizeof(*h));
	if (!f || sdev < 0 || sdev >= HAMI_SLICE_MAX_DEVICES)
		return;
	for (int i = 0; i < HAMI_SLICE_MAX_SLOTS; i++) {
		struct hami_slot *s = &f->slot[i];
		if (i == self || __atomic_load_n(&s->state, __ATOMIC_ACQUIRE) != HAMI_SLOT_LIVE)
			continue;
		uint64_t used = __atomic_load_n(&s->memory_used[sdev], __ATOMIC_ACQUIRE);
		char id[HAMI_SLICE_KERNEL_ID_LEN];
		memcpy(id, s->kernel_id, sizeof(id));
		id[sizeof(id) - 1] = 0;
		if (!used || (own[0] && !strcmp(id, own)))
			continue;
		if (!id[0]) {
			h->loose_bytes += used;
			continue;
		}
		int k = 0;
		while (k < seen && strcmp(ids[k], id))
			k++;
		if (k == seen) {
			if (seen == 64)
				continue;
			memcpy(ids[seen], id, sizeof(id));
			bytes[seen++] = 0;
		}
		bytes[k] += used;
	}
	for (int k = 0; k < seen; k++) {
		h->all_bytes += bytes[k];
		if (bytes[k] > h->bytes) {
			h->bytes = bytes[k];
			memcpy(h->id, ids[k], sizeof(h->id));
		}
	}
	h->kernels = seen;
}

void hami_oom_words(int sdev, struct hami_oom_words *w)
{
	struct holders h;
	char name[NAME_MAX_SHOWN + 8], a[32], b[32];
	other_holders(sdev, &h);
	w->held[0] = w->free_more[0] = 0;
	if (h.kernels) {
		if (!notebook_of(h.id, name, sizeof(name)))
			snprintf(name, sizeof(name), "kernel %.8s", h.id);
		if (h.kernels == 1)
			snprintf(w->held, sizeof(w->held), "; %s of it by another kernel of the slice: %s",
				 hami_human(h.bytes, a), name);
		else
			snprintf(w->held, sizeof(w->held), "; %s of it by %d other kernels of the slice, the most "
				 "(%s) by %s", hami_human(h.all_bytes, a), h.kernels, hami_human(h.bytes, b), name);
		snprintf(w->free_more, sizeof(w->free_more), ", or shut down or park %s's kernel (the GPU "
			 "slice panel in JupyterLab)", name);
	} else if (h.loose_bytes) {
		snprintf(w->held, sizeof(w->held), "; %s of it by other processes of the slice",
			 hami_human(h.loose_bytes, a));
	}
	/* Whom to ask: an administrator set the cap, or the hub gave it (its
	 * list of sizes), or whoever runs this server. */
	if (hami_limits_set_by_admin())
		snprintf(w->bigger, sizeof(w->bigger), "For a bigger cap, ask the administrator who set this one.");
	else if (getenv("JUPYTERHUB_API_URL") || getenv("JUPYTERHUB_USER"))
		snprintf(w->bigger, sizeof(w->bigger), "For a bigger cap, stop your server (File > Hub Control "
			 "Panel > Stop My Server) and start it again with a larger size from the hub's list, "
			 "or ask your administrator.");
	else
		snprintf(w->bigger, sizeof(w->bigger), "For a bigger cap, ask your administrator (on your own "
			 "machine: hami-jupyter slice set %s --memory SIZE).", hami_slice_name());
}

void hami_oom_advice(const struct hami_oom_words *w)
{
	hami_log(HAMI_LOG_ERROR, "To go on: free tensors you no longer need (del, then %%hami release in a "
		 "notebook gives the framework's cached memory back)%s. %s", w->free_more, w->bigger);
}

/*
 * The process's settings, read once from the environment. HAMi-core's names
 * are accepted so its users can move over; our own are HAMI_*. A malformed
 * value is an error that fails closed (cuInit refuses), never "no limit".
 */
#define _GNU_SOURCE
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "hami.h"

extern char **environ;

static struct hami_config config;
static pthread_once_t config_once = PTHREAD_ONCE_INIT;
static char slice_path_buf[PATH_MAX];

static void bad_setting(const char *name, const char *value, const char *why)
{
	hami_log(HAMI_LOG_ERROR, "%s=\"%s\" is %s; CUDA is disabled in this process until it is fixed",
		 name, value, why);
	config.error = 1;
}

static const char size_forms[] =
	"not a size (use bytes or a number with k, m, g or t, e.g. 4g, 4096m, 4Gi, 1.5g)";

static void read_size(const char *name, int *has, uint64_t *value)
{
	const char *v = getenv(name);
	if (!v)
		return;
	if (hami_parse_size(v, value) < 0) {
		bad_setting(name, v, size_forms);
		return;
	}
	*has = 1;
}

/* A memory limit of zero would refuse every allocation: surely a mistake. */
static void read_limit(const char *name, int *has, uint64_t *value)
{
	read_size(name, has, value);
	if (*has && *value == 0) {
		bad_setting(name, getenv(name), "zero (unset the variable for no limit)");
		*has = 0;
	}
}

/*
 * A small whole number as settings are written: one to three ASCII digits and
 * nothing else (no sign, no spaces, no tabs), at most max. The grammar is
 * hami_jupyter/slice/limits.py's too; tests/native/test_grammar.py runs both on one table.
 */
static int parse_small(const char *v, uint32_t max, uint32_t *out)
{
	size_t len = strlen(v);
	uint32_t n = 0;
	if (len == 0 || len > 3)
		return -1;
	for (const char *p = v; *p; p++) {
		if (*p < '0' || *p > '9')
			return -1;
		n = n * 10 + (uint32_t)(*p - '0');
	}
	if (n > max)
		return -1;
	*out = n;
	return 0;
}

/* A share in percent, 0..100; 0 and 100 mean "no limit" (HAMi's meaning). */
static void read_percent(const char *name, int *has, uint32_t *value)
{
	const char *v = getenv(name);
	if (!v)
		return;
	if (parse_small(v, 100, value) < 0) {
		bad_setting(name, v, "not an SM share (a whole percent 0-100, digits only; 0 or 100 = no share)");
		return;
	}
	*has = 1;
}

/* A count of decoders, 0..255 (what a slot can hold per GPU); 0 is no cap, as for the SM share. */
static void read_count(const char *name, int *has, uint32_t *value)
{
	const char *v = getenv(name);
	if (!v)
		return;
	if (parse_small(v, 255, value) < 0) {
		bad_setting(name, v, "not a decoder count (a whole number 0-255, digits only; 0 = no cap)");
		return;
	}
	*has = 1;
}

/*
 * Per-GPU variables name a CUDA ordinal 0..15 (what a slice can hold), written
 * plainly: a variable such as CUDA_DEVICE_MEMORY_LIMIT_16 or _00 would
 * otherwise be ignored without a word, leaving that GPU less limited than asked.
 */
static void check_ordinal_names(void)
{
	static const char *const prefixes[] = { "CUDA_DEVICE_MEMORY_LIMIT_", "CUDA_DEVICE_SM_LIMIT_",
						"HAMI_MAX_DECODERS_" };
	for (char **e = environ; e && *e; e++) {
		for (size_t p = 0; p < sizeof(prefixes) / sizeof(prefixes[0]); p++) {
			size_t plen = strlen(prefixes[p]);
			if (strncmp(*e, prefixes[p], plen) != 0)
				continue;
			const char *suffix = *e + plen, *eq = strchr(suffix, '=');
			size_t slen = eq ? (size_t)(eq - suffix) : strlen(suffix);
			uint32_t n;
			char digits[8];
			int ok = slen >= 1 && slen <= 2 && !(slen == 2 && suffix[0] == '0');
			if (ok) {
				memcpy(digits, suffix, slen);
				digits[slen] = '\0';
				ok = parse_small(digits, HAMI_SLICE_MAX_DEVICES - 1, &n) == 0;
			}
			if (!ok) {
				char name[128];
				snprintf(name, sizeof(name), "%.*s", (int)(plen + slen), *e);
				bad_setting(name, eq ? eq + 1 : "", "set for a GPU this library cannot name: the "
					    "suffix must be a GPU ordinal 0-15 written without leading zeros");
			}
		}
	}
}

/* A slice name: 1-63 of letters, digits and . _ @ + -, starting with a letter
 * or digit, not ending in ".slice" (hami_jupyter/slice/paths.py's rule). */
static int valid_slice_name(const char *name)
{
	size_t n = strlen(name);
	if (n == 0 || n >= HAMI_SLICE_NAME_LEN)
		return 0;
	for (size_t i = 0; i < n; i++) {
		char c = name[i];
		int alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
		if (!alnum && (i == 0 || !strchr("._@+-", c)))
			return 0;
	}
	const size_t suffix = sizeof(HAMI_SLICE_SUFFIX) - 1;
	return !(n >= suffix && strcmp(name + n - suffix, HAMI_SLICE_SUFFIX) == 0);
}

static const char name_rule[] = "not a slice name (1-63 letters, digits and . _ @ + -, starting with a "
				"letter or digit; a path's file name follows the same rule)";

static void read_mode(void)
{
	const char *v = getenv("HAMI_SM_MODE");
	if (!v || strcmp(v, "hard") == 0)
		config.sm_mode = HAMI_MODE_HARD;
	else if (strcmp(v, "elastic") == 0)
		config.sm_mode = HAMI_MODE_ELASTIC;
	else
		bad_setting("HAMI_SM_MODE", v, "not a mode (hard or elastic)");
}

#define ROOM_WAIT_DEFAULT_S 120
#define ROOM_WAIT_MAX_S 86400

/* HAMI_ROOM_WAIT: whole seconds 0..ROOM_WAIT_MAX_S, digits only (0: never wait for room). */
static void read_room_wait(void)
{
	const char *v = getenv("HAMI_ROOM_WAIT");
	config.room_wait_s = ROOM_WAIT_DEFAULT_S;
	if (!v)
		return;
	size_t len = strlen(v);
	uint32_t n = 0;
	int ok = len >= 1 && len <= 5;
	for (const char *p = v; ok && *p; p++) {
		ok = *p >= '0' && *p <= '9';
		n = n * 10 + (uint32_t)(*p - '0');
	}
	if (!ok || n > ROOM_WAIT_MAX_S) {
		bad_setting("HAMI_ROOM_WAIT", v, "not a wait for GPU room (whole seconds 0-86400, digits only; "
			    "0 = never wait)");
		return;
	}
	config.room_wait_s = n;
}

/* Until the GPU suite has passed with it, the fast park is off unless asked for. */
#define FAST_PARK_DEFAULT 0
#define FAST_PARK_KEEP_DEFAULT (256ull << 20)

/* HAMI_FAST_PARK: 0 or 1 (docs/preload.md); HAMI_FAST_PARK_KEEP: a size. */
static void read_fast_park(void)
{
	const char *v = getenv("HAMI_FAST_PARK");
	config.fast_park = FAST_PARK_DEFAULT;
	if (v && (strcmp(v, "0") == 0 || strcmp(v, "1") == 0))
		config.fast_park = v[0] == '1';
	else if (v)
		bad_setting("HAMI_FAST_PARK", v, "not 0 or 1 (1: allocations are made so that a park moves them "
			    "itself, at the host link's speed)");
	int has = 0;
	config.fast_park_keep = FAST_PARK_KEEP_DEFAULT;
	read_size("HAMI_FAST_PARK_KEEP", &has, &config.fast_park_keep);
	config.fast_park_copiers = -1;
	v = getenv("HAMI_FAST_PARK_COPIERS");
	uint32_t n;
	if (v && parse_small(v, 4, &n) == 0)
		config.fast_park_copiers = (int)n;
	else if (v)
		bad_setting("HAMI_FAST_PARK_COPIERS", v, "not a number of copying threads (0-4, digits only; unset: "
			    "half the CPUs, at most 4, none on 2 CPUs)");
}

/* HAMI_BROKER_SOCKET: an absolute path that fits a Unix socket address. */
static void read_broker_socket(void)
{
	const char *v = getenv("HAMI_BROKER_SOCKET");
	config.broker_socket = HAMI_HUB_SLICE_ROOT "/broker.sock";
	if (!v)
		return;
	if (v[0] != '/' || strlen(v) >= sizeof(((struct sockaddr_un *)0)->sun_path)) {
		bad_setting("HAMI_BROKER_SOCKET", v, "not the memory broker's socket (an absolute path of "
			    "at most 107 bytes)");
		return;
	}
	config.broker_socket = v;
}

static void copy_bounded(char *dst, size_t cap, const char *src)
{
	size_t n = src ? strnlen(src, cap - 1) : 0;
	if (n)
		memcpy(dst, src, n);
	dst[n] = '\0';
}

/* A slice given by name lives under the slice root; a value with '/' is a path.
 * The root's order is slice_file.h's, which hami_jupyter/slice/paths.py follows
 * too (tests/test_slice_root.py runs both). NULL: the path would not fit. */
static const char *resolve_slice_path(const char *value)
{
	if (strchr(value, '/'))
		return value;
	const char *root = getenv("HAMI_SLICE_ROOT");
	char fallback[128];
	struct stat st;
	if ((!root || !*root) && stat(HAMI_HUB_SLICE_ROOT, &st) == 0 && S_ISDIR(st.st_mode))
		root = HAMI_HUB_SLICE_ROOT; /* the hub manages slices on this host */
	if (!root || !*root) {
		const char *xdg = getenv("XDG_RUNTIME_DIR");
		if (xdg && *xdg) {
			int w = snprintf(slice_path_buf, sizeof(slice_path_buf),
					 "%s/" HAMI_SLICE_ROOT_SUBDIR "/%s" HAMI_SLICE_SUFFIX, xdg, value);
			return w > 0 && (size_t)w < sizeof(slice_path_buf) ? slice_path_buf : NULL;
		}
		snprintf(fallback, sizeof(fallback), HAMI_SLICE_ROOT_TMP_PREFIX "%u", (unsigned)getuid());
		root = fallback;
	}
	int w = snprintf(slice_path_buf, sizeof(slice_path_buf), "%s/%s" HAMI_SLICE_SUFFIX, root, value);
	return w > 0 && (size_t)w < sizeof(slice_path_buf) ? slice_path_buf : NULL;
}

/* The slice's name: its file name less ".slice". 0, or -1 when that is no slice name. */
static int slice_name_from_path(const char *path)
{
	char name[PATH_MAX];
	const char *base = strrchr(path, '/');
	base = base ? base + 1 : path;
	copy_bounded(name, sizeof(name), base);
	size_t n = strlen(name);
	const size_t suffix = sizeof(HAMI_SLICE_SUFFIX) - 1;
	if (n > suffix && strcmp(name + n - suffix, HAMI_SLICE_SUFFIX) == 0)
		name[n - suffix] = '\0';
	if (!valid_slice_name(name))
		return -1;
	copy_bounded(config.slice_name, sizeof(config.slice_name), name);
	return 0;
}

static void read_config(void)
{
	read_limit("CUDA_DEVICE_MEMORY_LIMIT", &config.has_memory_default, &config.memory_default);
	for (int i = 0; i < HAMI_SLICE_MAX_DEVICES; i++) {
		char name[64];
		int has = 0;
		snprintf(name, sizeof(name), "CUDA_DEVICE_MEMORY_LIMIT_%d", i);
		read_limit(name, &has, &config.memory_ordinal[i]);
		config.has_memory_ordinal[i] = (uint8_t)has;
	}
	read_percent("CUDA_DEVICE_SM_LIMIT", &config.has_sm_default, &config.sm_default);
	for (int i = 0; i < HAMI_SLICE_MAX_DEVICES; i++) {
		char name[64];
		int has = 0;
		snprintf(name, sizeof(name), "CUDA_DEVICE_SM_LIMIT_%d", i);
		read_percent(name, &has, &config.sm_ordinal[i]);
		config.has_sm_ordinal[i] = (uint8_t)has;
	}
	read_count("HAMI_MAX_DECODERS", &config.has_decoders_default, &config.decoders_default);
	for (int i = 0; i < HAMI_SLICE_MAX_DEVICES; i++) {
		char name[64];
		int has = 0;
		snprintf(name, sizeof(name), "HAMI_MAX_DECODERS_%d", i);
		read_count(name, &has, &config.decoders_ordinal[i]);
		config.has_decoders_ordinal[i] = (uint8_t)has;
	}
	check_ordinal_names();
	read_mode();
	read_size("HAMI_CONTEXT_OVERHEAD", &config.has_context_overhead, &config.context_overhead);
	read_limit("HAMI_PROCESS_MEMORY_LIMIT", &config.has_process_limit, &config.process_limit);
	read_room_wait();
	read_broker_socket();
	read_fast_park();

	const char *slice_var = getenv("HAMI_SLICE") ? "HAMI_SLICE" : "CUDA_DEVICE_MEMORY_SHARED_CACHE";
	const char *slice = getenv(slice_var);
	if (slice && !*slice)
		bad_setting(slice_var, slice, "empty (give a slice name or file path, or unset it for a private slice)");
	else if (slice && !strchr(slice, '/') && !valid_slice_name(slice))
		bad_setting(slice_var, slice, name_rule);
	else if (slice && !(config.slice_path = resolve_slice_path(slice)))
		bad_setting(slice_var, slice, "too long for a slice path");
	else if (slice && slice_name_from_path(config.slice_path) < 0)
		bad_setting(slice_var, slice, name_rule);
	else if (!slice)
		snprintf(config.slice_name, sizeof(config.slice_name), "private-%d", (int)getpid());
	const char *name = getenv("HAMI_SLICE_NAME");
	if (name && !valid_slice_name(name))
		bad_setting("HAMI_SLICE_NAME", name, name_rule);
	else if (name)
		copy_bounded(config.slice_name, sizeof(config.slice_name), name);
	copy_bounded(config.kernel_id, sizeof(config.kernel_id), getenv("HAMI_KERNEL_ID"));
}

const struct hami_config *hami_config(void)
{
	pthread_once(&config_once, read_config);
	return &config;
}

/* The limit this process's environment asks for on CUDA ordinal n. */
int hami_config_memory_limit(int ordinal, uint64_t *limit)
{
	const struct hami_config *c = hami_config();
	if (ordinal >= 0 && ordinal < HAMI_SLICE_MAX_DEVICES && c->has_memory_ordinal[ordinal]) {
		*limit = c->memory_ordinal[ordinal];
		return 1;
	}
	if (c->has_memory_default) {
		*limit = c->memory_default;
		return 1;
	}
	return 0;
}

/* The SM share this process's environment asks for on CUDA ordinal n (-1: any). */
int hami_config_sm_share(int ordinal, uint32_t *percent)
{
	const struct hami_config *c = hami_config();
	if (ordinal >= 0 && ordinal < HAMI_SLICE_MAX_DEVICES && c->has_sm_ordinal[ordinal]) {
		*percent = c->sm_ordinal[ordinal];
		return 1;
	}
	if (c->has_sm_default) {
		*percent = c->sm_default;
		return 1;
	}
	return 0;
}

/*
 * The limits a new slice file gets from its creator's environment: for
 * ordinal -1 the fallback entry, else the entry of GPU n, which is only "set"
 * when a per-GPU variable names it (otherwise that GPU follows the fallback).
 */
int hami_config_limit(int ordinal, struct hami_device_limit *out)
{
	const struct hami_config *c = hami_config();
	uint64_t bytes;
	uint32_t pct;
	memset(out, 0, sizeof(*out));
	int own = ordinal >= 0 && ordinal < HAMI_SLICE_MAX_DEVICES &&
		  (c->has_memory_ordinal[ordinal] || c->has_sm_ordinal[ordinal] ||
		   c->has_decoders_ordinal[ordinal]);
	int any = c->has_memory_default || c->has_sm_default || c->sm_mode != HAMI_MODE_HARD ||
		  c->has_decoders_default;
	if (ordinal >= 0 && !own)
		return 0;
	if (hami_config_memory_limit(ordinal, &bytes))
		out->memory_limit = bytes;
	if (hami_config_sm_share(ordinal, &pct))
		out->sm_share = pct;
	out->mode = c->sm_mode;
	out->max_decoders = ordinal >= 0 && ordinal < HAMI_SLICE_MAX_DEVICES && c->has_decoders_ordinal[ordinal]
				    ? c->decoders_ordinal[ordinal]
				    : c->decoders_default;
	if (own || any)
		out->flags = HAMI_LIMIT_SET;
	return (out->flags & HAMI_LIMIT_SET) != 0;
}

/*
 * The CUDA ordinal of a GPU known only through NVML (a process such as
 * nvidia-smi that never calls cuInit). CUDA_VISIBLE_DEVICES lists indices or
 * UUID prefixes; we assume CUDA's order equals NVML's (PCI) order, which holds
 * on hosts of identical GPUs. -1: not visible.
 */
int hami_config_ordinal_of(const char *uuid, int nvml_index)
{
	const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
	if (!cvd)
		return nvml_index;
	char buf[1024];
	copy_bounded(buf, sizeof(buf), cvd);
	int ordinal = 0;
	char *save = NULL;
	for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save), ordinal++) {
		while (*tok == ' ')
			tok++;
		char *end;
		long idx = strtol(tok, &end, 10);
		if (end != tok && *end == '\0') {
			if (idx == nvml_index)
				return ordinal;
			continue;
		}
		if (strncmp(tok, "GPU-", 4) == 0 || strncmp(tok, "MIG-", 4) == 0) {
			if (strncmp(uuid, tok, strlen(tok)) == 0)
				return ordinal;
			continue;
		}
		return -1; /* the driver stops at the first invalid entry */
	}
	return -1;
}

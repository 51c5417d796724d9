/*
 * What this process was charged for, by handle (pointer, array, context,
 * pool...), so every free credits exactly what its allocation charged.
 * Process-local: an open-addressing hash table under one mutex.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "hami.h"

#define EMPTY 0u
#define DELETED 0xffffffffu

static struct hami_record *table;
static size_t capacity; /* power of two */
static size_t used;     /* live + deleted */
static size_t live;
pthread_mutex_t hami_records_mutex = PTHREAD_MUTEX_INITIALIZER;
#define lock hami_records_mutex

static size_t hash(uint32_t kind, uint64_t key)
{
	uint64_t h = key ^ ((uint64_t)kind << 56);
	h ^= h >> 33;
	h *= 0xff51afd7ed558ccdull;
	h ^= h >> 33;
	return (size_t)h;
}

static struct hami_record *find(uint32_t kind, uint64_t key)
{
	if (!capacity)
		return NULL;
	for (size_t i = hash(kind, key) & (capacity - 1), n = 0; n < capacity; i = (i + 1) & (capacity - 1), n++) {
		struct hami_record *r = &table[i];
		if (r->kind == EMPTY)
			return NULL;
		if (r->kind == kind && r->key == key)
			return r;
	}
	return NULL;
}

static int grow(void)
{
	size_t cap = capacity ? capacity * 2 : 1024;
	if (live * 4 < capacity)
		cap = capacity; /* mostly tombstones: rehash in place size */
	struct hami_record *t = calloc(cap, sizeof(*t));
	if (!t)
		return -1;
	for (size_t i = 0; i < capacity; i++) {
		struct hami_record *r = &table[i];
		if (r->kind == EMPTY || r->kind == DELETED)
			continue;
		size_t j = hash(r->kind, r->key) & (cap - 1);
		while (t[j].kind != EMPTY)
			j = (j + 1) & (cap - 1);
		t[j] = *r;
	}
	free(table);
	table = t;
	capacity = cap;
	used = live;
	return 0;
}

int hami_record_put(const struct hami_record *r)
{
	pthread_mutex_lock(&lock);
	struct hami_record *old = find(r->kind, r->key);
	if (old) {
		*old = *r; /* the driver reused a handle we missed the free of */
		pthread_mutex_unlock(&lock);
		return 0;
	}
	if ((used + 1) * 4 > capacity * 3 && grow() < 0) {
		pthread_mutex_unlock(&lock);
		return -1;
	}
	size_t i = hash(r->kind, r->key) & (capacity - 1);
	while (table[i].kind != EMPTY && table[i].kind != DELETED)
		i = (i + 1) & (capacity - 1);
	if (table[i].kind == EMPTY)
		used++;
	table[i] = *r;
	live++;
	pthread_mutex_unlock(&lock);
	return 0;
}

int hami_record_get(uint32_t kind, uint64_t key, struct hami_record *out)
{
	pthread_mutex_lock(&lock);
	struct hami_record *r = find(kind, key);
	if (r && out)
		*out = *r;
	pthread_mutex_unlock(&lock);
	return r ? 0 : -1;
}

int hami_record_take(uint32_t kind, uint64_t key, struct hami_record *out)
{
	pthread_mutex_lock(&lock);
	struct hami_record *r = find(kind, key);
	if (r) {
		if (out)
			*out = *r;
		memset(r, 0, sizeof(*r));
		r->kind = DELETED;
		live--;
	}
	pthread_mutex_unlock(&lock);
	return r ? 0 : -1;
}

void hami_record_sums(uint32_t mask, uint64_t out[HAMI_SLICE_MAX_DEVICES])
{
	memset(out, 0, HAMI_SLICE_MAX_DEVICES * sizeof(out[0]));
	pthread_mutex_lock(&lock);
	for (size_t i = 0; i < capacity; i++) {
		const struct hami_record *r = &table[i];
		if (r->kind == EMPTY || r->kind == DELETED || r->kind >= 32 || !(mask & (1u << r->kind)) ||
		    r->sdev < 0 || r->sdev >= HAMI_SLICE_MAX_DEVICES)
			continue;
		out[r->sdev] += r->bytes;
	}
	pthread_mutex_unlock(&lock);
}

/* After fork: the child owns no device memory of its own yet. */
void hami_records_reset(void)
{
	free(table);
	table = NULL;
	capacity = used = live = 0;
}

/*
 * After the driver freed (or refused to free) something we took out of the
 * table: credit its charge, or put the record back if the free failed.
 */
void hami_settle_free(int known, const struct hami_record *r, CUresult rc)
{
	if (!known)
		return;
	if (rc == CUDA_SUCCESS)
		hami_credit(r->sdev, r->bytes);
	else
		hami_record_put(r);
}

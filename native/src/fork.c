/*
 * fork(): a child inherits every mutex in the state it had, but only the
 * thread that forked. A lock another thread held at that instant would never
 * be released in the child, and its first CUDA call would wait forever.
 *
 * Two kinds of lock, two answers:
 *  - locks never held across a call into the driver are taken by the forking
 *    thread first (in the order they nest) and released in both processes
 *    after;
 *  - locks held across a driver call (set-up, primary contexts, pool figures)
 *    cannot be: the driver's own fork handlers, which run before ours when it
 *    was loaded after us, hold the driver's locks, and a thread of ours inside
 *    the driver with one of these locks would never give it up. The child
 *    makes them anew instead, with the state they guard (it has no CUDA
 *    state of its parent's anyway).
 *
 * The handlers are installed when the library loads, before any thread of
 * ours or of the program can hold one.
 */
#include <pthread.h>

#include "hami.h"

static pthread_mutex_t *const taken[] = {
	&hami_graph_lock,
	&hami_open_lock,
	&hami_thunks_lock,
	&hami_room_lock, /* room.c takes the slot lock under it */
	&hami_claim_lock,
	&hami_slot_lock,
	&hami_records_mutex,
	&hami_vm_lock,
	&hami_ledger_open_lock, /* innermost: nothing is taken under it */
};

static pthread_mutex_t *const made_anew[] = {
	&hami_setup_lock,
	&hami_context_lock,
	&hami_pool_lock,
};

#define NTAKEN (sizeof(taken) / sizeof(taken[0]))
#define NANEW (sizeof(made_anew) / sizeof(made_anew[0]))

static void prepare(void)
{
	for (size_t i = 0; i < NTAKEN; i++)
		pthread_mutex_lock(taken[i]);
}

static void release_all(void)
{
	for (size_t i = NTAKEN; i-- > 0;)
		pthread_mutex_unlock(taken[i]);
}

/* The child: one thread, no GPU state (CUDA does not cross fork), no slot. */
static void child(void)
{
	release_all();
	for (size_t i = 0; i < NANEW; i++)
		pthread_mutex_init(made_anew[i], NULL);
	hami_records_reset();
	hami_vm_after_fork();
	hami_slice_after_fork();
	hami_park_after_fork();
	hami_room_after_fork();
	hami_true_up_after_fork();
	hami_process_after_fork();
	hami_contexts_after_fork();
	hami_schedule_after_fork();
}

__attribute__((constructor)) static void install(void)
{
	pthread_atfork(prepare, release_all, child);
}

/* oom_words.c: the plain words of an out-of-memory refusal. */
#ifndef HAMI_OOM_WORDS_H
#define HAMI_OOM_WORDS_H

struct hami_oom_words {
	/* "; 1.5 GiB of it by another kernel of the slice: analysis.ipynb", or "" */
	char held[224];
	/* ", or shut down or park analysis.ipynb's kernel (…)", or "" */
	char free_more[192];
	/* "For a bigger cap, …": whom to ask, and how */
	char bigger[256];
};

/* Who else holds memory of the slice on slice device sdev, and whom to ask for more. */
void hami_oom_words(int sdev, struct hami_oom_words *w);

/* Logs the line of what a person can do: "To go on: …". */
void hami_oom_advice(const struct hami_oom_words *w);

#endif

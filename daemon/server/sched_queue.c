/*
 * sched_queue.c - the scheduler's one queue type (sched_internal.h): an
 * intrusive singly linked FIFO with a tail pointer and a count. The job
 * queue, the prep thread's queue, the prep tasks in flight and the
 * engine -> loop inbox are all one of these; none allocates, and none
 * locks (each queue's owner says which lock or thread guards it).
 */
#include "server/sched_internal.h"

void sched_fifo_push(struct sched_fifo *q, struct sched_link *l)
{
	l->next = NULL;
	if (q->tail)
		q->tail->next = l;
	else
		q->head = l;
	q->tail = l;
	q->n++;
}

struct sched_link *sched_fifo_pop(struct sched_fifo *q)
{
	struct sched_link *l = q->head;

	if (!l)
		return NULL;
	q->head = l->next;
	if (!q->head)
		q->tail = NULL;
	q->n--;
	l->next = NULL;
	return l;
}

bool sched_fifo_remove(struct sched_fifo *q, struct sched_link *l)
{
	struct sched_link *prev = NULL;

	for (struct sched_link *p = q->head; p; prev = p, p = p->next) {
		if (p != l)
			continue;
		if (prev)
			prev->next = p->next;
		else
			q->head = p->next;
		if (q->tail == p)
			q->tail = prev;
		q->n--;
		p->next = NULL;
		return true;
	}
	return false;
}

void sched_fifo_move_if(struct sched_fifo *q, struct sched_fifo *out,
			bool (*match)(const struct sched_link *l, const void *ctx), const void *ctx)
{
	struct sched_fifo keep = { NULL, NULL, 0 };
	struct sched_link *l;

	while ((l = sched_fifo_pop(q)))
		sched_fifo_push(!match || match(l, ctx) ? out : &keep, l);
	*q = keep;
}

/*
 * sched_admit.c - admission: whether a request may become a job, and the
 * ACCEPTED replies. sched_admit() is the one place that answers BUSY (the
 * gateway's 429), a duplicate request id or a draining k3d, for every kind
 * of job, before any work is done for the request; sched_enqueue() puts an
 * admitted, prepared job at the tail of the queue and tells its client the
 * job id and queue position, and sched_send_positions() tells queued
 * clients when their position changes.
 *
 * Loop thread only; the queue itself is read under s->lock.
 */
#include "server/sched_internal.h"

#include <errno.h>
#include <string.h>

/* The position ACCEPTED gives the queue's index-th job (0 = its head):
 * how many jobs wait for a seat before it, counting itself, once the free
 * seats have taken the first ones; 0 = a seat takes it at once. A job a
 * free seat is about to take is not queued, so it is never told it is.
 * Under s->lock. */
static uint32_t queue_position(const struct k3_sched *s, unsigned index)
{
	unsigned seats = s->parallel ? s->parallel : 1;
	unsigned free_seats = s->n_running < seats ? seats - s->n_running : 0;

	return index < free_seats ? 0 : index + 1 - free_seats;
}

/* What a job of kind is called in refusals. */
static const char *kind_noun(enum k3_proto_job_kind kind)
{
	return kind == K3_JOB_WARM_EXPERTS ? "expert preload" : "generation";
}

int sched_admit(struct k3_sched *s, struct k3_conn *c, uint32_t rid)
{
	enum k3_proto_job_kind dup_kind = K3_JOB_GENERATE, running_kind = K3_JOB_GENERATE;
	unsigned running = 0, waiting, seats = s->parallel ? s->parallel : 1;
	bool dup = false;

	if (s->draining) {
		k3_conn_send_error(c, rid, K3_STATUS_SHUTTING_DOWN, NULL, "k3d is shutting down");
		return -ESHUTDOWN;
	}
	pthread_mutex_lock(&s->lock);
	/* A running job already told to stop ends within one layer step; a
	 * client that cancelled (or disconnected) and asks again at once must
	 * not be answered BUSY for that window: it queues behind it. Requests
	 * still on the prep thread hold a place in the queue. */
	for (unsigned i = 0; i < s->n_running; i++) {
		const struct sched_job *r = s->running[i];

		running += !atomic_load(&r->cancel);
		running_kind = r->kind;
		/* Events and CANCEL are matched by request id: two live jobs
		 * with one id on one connection could not be told apart. */
		if (!dup && r->conn == c && r->rid == rid) {
			dup = true;
			dup_kind = r->kind;
		}
	}
	waiting = s->queue.n + s->n_prepping;
	for (const struct sched_link *l = s->queue.head; l && !dup; l = l->next) {
		const struct sched_job *q = sched_entry(l, const struct sched_job, link);

		if ((dup = q->conn == c && q->rid == rid))
			dup_kind = q->kind;
	}
	pthread_mutex_unlock(&s->lock);
	if (!dup && (dup = sched_prep_has_rid(s, c, rid)))
		dup_kind = K3_JOB_GENERATE;
	if (dup) {
		k3_conn_send_error(c, rid, K3_STATUS_BAD_REQUEST, NULL,
				   "request id %u is already in use by a queued or running %s "
				   "on this connection", rid,
				   k3_proto_type_name(dup_kind == K3_JOB_WARM_EXPERTS ? K3_MSG_WARM_EXPERTS :
						      K3_MSG_GENERATE));
		return -EEXIST;
	}
	/* queue_max counts the jobs waiting behind the running ones: with
	 * --parallel N, N seats run and queue_max more wait; BUSY only when
	 * both are full. */
	if (seats > 1 && running + waiting >= seats + s->opts->queue_max) {
		k3_conn_send_error(c, rid, K3_STATUS_BUSY, NULL,
				   "engine busy: %u/%u generations running and %u/%u queued; retry later",
				   running < seats ? running : seats, seats,
				   running + waiting - (running < seats ? running : seats),
				   s->opts->queue_max);
		return -EBUSY;
	}
	if (seats == 1 && running + waiting > s->opts->queue_max) {
		if (running)
			k3_conn_send_error(c, rid, K3_STATUS_BUSY, NULL,
					   "engine busy: 1 %s running and %u/%u queued; retry later",
					   kind_noun(running_kind), waiting, s->opts->queue_max);
		else
			k3_conn_send_error(c, rid, K3_STATUS_BUSY, NULL,
					   "engine busy: %u/%u queued; retry later", waiting,
					   s->opts->queue_max);
		return -EBUSY;
	}
	return 0;
}

void sched_enqueue(struct k3_sched *s, struct k3_conn *c, struct sched_job *j)
{
	struct k3_msg_accepted a;
	unsigned ahead;

	if (j->err_status) {
		k3_conn_send_error(c, j->rid, j->err_status, j->err_param, "%s", j->err_msg);
		sched_job_free(j);
		return;
	}
	j->conn = k3_conn_ref(c);
	j->uid = (uint32_t)k3_conn_uid(c);
	j->id = ++s->next_job_id;
	clock_gettime(CLOCK_MONOTONIC, &j->t_submit);
	pthread_mutex_lock(&s->lock);
	ahead = queue_position(s, s->queue.n);
	sched_fifo_push(&s->queue, &j->link);
	pthread_cond_signal(&s->cond);
	pthread_mutex_unlock(&s->lock);
	if (j->kind != K3_JOB_GENERATE)
		return;   /* WARM_EXPERTS answers only at its end */
	j->queue_pos_sent = ahead;
	memset(&a, 0, sizeof(a));
	k3_msg_accepted_set_job_id(&a, j->id);
	k3_msg_accepted_set_queue_position(&a, ahead);
	k3_msg_accepted_set_prompt_tokens(&a, (uint32_t)j->prompt.n);
	k3_conn_send(c, K3_MSG_ACCEPTED, j->rid, &a);
}

void sched_send_positions(struct k3_sched *s)
{
	unsigned index = 0;

	pthread_mutex_lock(&s->lock);
	for (struct sched_link *l = s->queue.head; l; l = l->next, index++) {
		struct sched_job *j = sched_entry(l, struct sched_job, link);
		uint32_t pos = queue_position(s, index);

		if (j->kind == K3_JOB_GENERATE && pos && j->queue_pos_sent != pos && j->conn &&
		    k3_conn_is_open(j->conn)) {
			struct k3_msg_accepted a;

			memset(&a, 0, sizeof(a));
			k3_msg_accepted_set_job_id(&a, j->id);
			k3_msg_accepted_set_queue_position(&a, pos);
			k3_conn_send(j->conn, K3_MSG_ACCEPTED, j->rid, &a);
			j->queue_pos_sent = pos;
		}
	}
	pthread_mutex_unlock(&s->lock);
}

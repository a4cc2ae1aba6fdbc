/*
 * writer.c — the guest's one helper thread: it runs large uploads' direct
 * writes (fs.c) while the loop goes on reading the next chunk, so the disk and
 * the network overlap instead of taking turns (guest.h).
 *
 * It only calls pwrite(2) (spaced_io_pwrite_full) and its own mutex and
 * condition variables: the loop thread's fork()s of commands never find it
 * holding anything they need.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include "guest.h"

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t work = PTHREAD_COND_INITIALIZER, done = PTHREAD_COND_INITIALIZER;
static struct wjob *head, **tail = &head;
static bool started;

static void *writer_main(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&mu);
	for (;;) {
		while (head == NULL)
			pthread_cond_wait(&work, &mu);
		struct wjob *j = head;
		head = j->next;
		if (head == NULL)
			tail = &head;
		pthread_mutex_unlock(&mu);
		int err = spaced_io_pwrite_full(j->fd, j->p, j->n, j->off) < 0 ? errno : 0;
		pthread_mutex_lock(&mu);
		j->err = err;
		j->busy = false;
		pthread_cond_broadcast(&done);
	}
	return NULL;
}

int writer_submit(struct wjob *j)
{
	pthread_mutex_lock(&mu);
	if (!started) {
		/* every signal blocked in the thread (the loop reads them from its signalfd) */
		sigset_t all, old;
		sigfillset(&all);
		pthread_sigmask(SIG_SETMASK, &all, &old);
		pthread_attr_t a;
		pthread_t t;
		int e = pthread_attr_init(&a);
		if (e == 0) {
			pthread_attr_setstacksize(&a, 64 * 1024);
			pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
			e = pthread_create(&t, &a, writer_main, NULL);
			pthread_attr_destroy(&a);
		}
		pthread_sigmask(SIG_SETMASK, &old, NULL);
		if (e != 0) {
			pthread_mutex_unlock(&mu);
			return -e;
		}
		started = true;
	}
	j->busy = true;
	j->err = 0;
	j->next = NULL;
	*tail = j;
	tail = &j->next;
	pthread_cond_signal(&work);
	pthread_mutex_unlock(&mu);
	return 0;
}

int writer_wait(struct wjob *j)
{
	pthread_mutex_lock(&mu);
	while (j->busy)
		pthread_cond_wait(&done, &mu);
	int err = j->err;
	pthread_mutex_unlock(&mu);
	return err;
}

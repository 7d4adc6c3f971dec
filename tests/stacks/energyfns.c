/*
 * The stack tests' workload, built by them with frame pointers:
 *   cc -O1 -g -fno-omit-frame-pointer -o energyfns energyfns.c
 *
 *   energyfns alternate SECONDS  energy_fn_a and energy_fn_b in one thread,
 *                                alternating 2 ms and 1 ms of CPU time
 *   energyfns short              20 ms of CPU in short_lived_named_fn, then exit
 *   energyfns pipe SECONDS       1-byte writes to a pipe and reads back
 *                                (kernel-heavy)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static volatile unsigned long sink;

static double cpu_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Arithmetic for about 30 us between clock reads, so little time is
 * spent in the vDSO (which keeps no frame pointer). */
static inline void work(void)
{
	for (unsigned long i = 0; i < 20000; i++)
		sink += i * i;
}

__attribute__((noinline)) void energy_fn_a(double slice_s)
{
	double end = cpu_s() + slice_s;
	while (cpu_s() < end)
		work();
}

__attribute__((noinline)) void energy_fn_b(double slice_s)
{
	double end = cpu_s() + slice_s;
	while (cpu_s() < end)
		work();
}

__attribute__((noinline)) void short_lived_named_fn(double slice_s)
{
	double end = cpu_s() + slice_s;
	while (cpu_s() < end)
		work();
}

__attribute__((noinline)) void pipe_ping(double seconds)
{
	int fds[2];
	char c = 'x';
	struct timespec t0, t;
	if (pipe(fds) != 0) {
		perror("pipe");
		exit(1);
	}
	clock_gettime(CLOCK_MONOTONIC, &t0);
	do {
		for (int i = 0; i < 1000; i++) {
			if (write(fds[1], &c, 1) != 1 || read(fds[0], &c, 1) != 1) {
				perror("pipe i/o");
				exit(1);
			}
		}
		clock_gettime(CLOCK_MONOTONIC, &t);
	} while ((double)(t.tv_sec - t0.tv_sec) + (double)(t.tv_nsec - t0.tv_nsec) * 1e-9 < seconds);
}

int main(int argc, char **argv)
{
	if (argc >= 3 && strcmp(argv[1], "alternate") == 0) {
		double total = atof(argv[2]);
		while (cpu_s() < total) {
			energy_fn_a(0.002);
			energy_fn_b(0.001);
		}
		return 0;
	}
	if (argc >= 2 && strcmp(argv[1], "short") == 0) {
		short_lived_named_fn(0.020);
		return 0;
	}
	if (argc >= 3 && strcmp(argv[1], "pipe") == 0) {
		pipe_ping(atof(argv[2]));
		return 0;
	}
	fprintf(stderr, "usage: energyfns alternate SECONDS | short | pipe SECONDS\n");
	return 2;
}

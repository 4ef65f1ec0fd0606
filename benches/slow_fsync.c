/*
 * A slower disk for benchmarks: every fsync() and fdatasync() of the process
 * returns FSYNC_DELAY_US microseconds (default 1000) after the real one.
 * Nothing else changes. Linux only; it shows what the journal's fsyncs cost
 * on a disk slower than this machine's (docs/performance.md, "The WAL's
 * fsync outside the lock").
 *
 *   cc -shared -fPIC -O2 -o /tmp/slow_fsync.so benches/slow_fsync.c -ldl
 *   LD_PRELOAD=/tmp/slow_fsync.so FSYNC_DELAY_US=1000 RELAYS="hub:sqlite" benches/compare.sh
 *
 * The bench client and the fixture never fsync, so preloading it into every
 * process of compare.sh slows only the hub's journal.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <time.h>

static void nap(void) {
    const char *env = getenv("FSYNC_DELAY_US");
    long us = env ? atol(env) : 1000;
    struct timespec t = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&t, NULL);
}

int fsync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    int r = real(fd);
    nap();
    return r;
}

int fdatasync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    int r = real(fd);
    nap();
    return r;
}

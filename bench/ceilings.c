/* The machine's own ceilings for the benchmarks in bench/run.py, measured in the same run.
 *
 *   ceilings memcpy BYTES THREADS REPS          copy between two pre-faulted buffers
 *   ceilings touch  BYTES THREADS REPS [HUGE [IDLE]]
 *                                               write once into freshly mmap'ed memory (page faults + zeroing);
 *                                               IDLE: sleep that many seconds before each repetition, so the
 *                                               memory freed before it has been free a while (a VM with free
 *                                               page reporting hands such memory back to its host)
 *   ceilings pread  FILE  THREADS REPS MEMORY [PIECE_MIB]
 *                                               read the whole file with pread, in 8 MiB pieces (or PIECE_MIB;
 *                                               0: the whole file in one call) handed out to THREADS threads,
 *                                               into: MEMORY=0 one buffer faulted in before the first
 *                                               repetition, 1 new memory each repetition, 2 new memory with
 *                                               MADV_HUGEPAGE each repetition, 3 new memory each repetition,
 *                                               each 512 KiB step of a piece faulted in with
 *                                               MADV_POPULATE_WRITE just before it is read
 *   ceilings direct FILE  DEPTH REPS [PIECE_KIB [URING]]
 *                                               read the whole file with O_DIRECT, past the page cache (so every
 *                                               repetition is cold), in pieces of PIECE_KIB (default 8192) into
 *                                               one page-aligned buffer faulted in before the first repetition,
 *                                               with DEPTH reads in flight: DEPTH threads each with one pread
 *                                               (URING=0), or one thread keeping DEPTH reads queued on an
 *                                               io_uring (URING=1; raw syscalls, no liburing)
 *   ceilings uring  FILE  DEPTH REPS MEMORY
 *                                               read the whole file through the page cache on one thread that
 *                                               keeps DEPTH reads of 8 MiB queued on an io_uring (raw syscalls),
 *                                               into memory chosen by MEMORY as for pread (0, 1, 2; 3 is 1)
 *   ceilings write  FILE  BYTES THREADS REPS FSYNC
 *                                               write BYTES from a pre-faulted buffer to a new FILE with
 *                                               pwrite in 8 MiB pieces (FSYNC=1: then fsync the file and its
 *                                               directory); the file is unlinked after each repetition
 *
 * Prints one JSON object: {"op", "bytes", "threads", "seconds": [one per repetition]}, and for pread and uring
 * also "minor_faults", "user_seconds", "sys_seconds": the process's getrusage over all repetitions.
 * With CEILINGS_START_AT set (seconds on CLOCK_MONOTONIC, which every process of the machine shares), the
 * first repetition of touch, pread and uring waits until then before its clock starts, and "late_seconds"
 * says how far past it that was (0: on time): the harness sets it to the moment the previous measured process
 * ended plus its idle, so a C row's fill meets memory freed exactly as long before as a Python row's load,
 * whose interpreter start-up falls inside the same pause (bench/suite/pagecache.py, wait_until). With
 * CEILINGS_HOLD_BYTES set, that much anonymous memory is written first and held to the end ("held_bytes"), as
 * a Python load's process holds its interpreter and imports when its clock starts: memory taken after the
 * previous process ended is memory freed a moment ago, the cheapest there is, that the fill then does not get. Fresh
 * memory is anonymous private mmap, without MADV_HUGEPAGE unless HUGE=1 / MEMORY=2: plain is what glibc malloc
 * (and so torch.empty) gives a large allocation; numpy asks for huge pages on large arrays, which on a kernel
 * with transparent huge pages set to "madvise" makes first touch take 512x fewer page faults (whether it is
 * faster depends on the host: bench/fresh_memory.py measures both).
 * Build: cc -O2 -pthread ceilings.c -o ceilings (bench/run.py does it).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/io_uring.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static size_t piece = (size_t)8 << 20; /* bytes per pread / pwrite call, handed out to the threads */

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double seconds_of(struct timeval tv) { return (double)tv.tv_sec + (double)tv.tv_usec * 1e-6; }

/* Sleeps until `at` on the CLOCK_MONOTONIC clock; returns how many seconds past it this returns (0: on time). */
static double wait_until(double at) {
  double left = at - now();
  if (left <= 0) return -left;
  struct timespec ts = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
  return 0;
}

static void die(const char* what) {
  fprintf(stderr, "ceilings: %s: %s\n", what, strerror(errno));
  exit(1);
}

/* CEILINGS_HOLD_BYTES: written now, held until exit. Returns the bytes held. */
static size_t hold_memory(void) {
  const char* s = getenv("CEILINGS_HOLD_BYTES");
  size_t n = s ? (size_t)strtoull(s, NULL, 10) : 0;
  if (n == 0) return 0;
  void* p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) die("mmap CEILINGS_HOLD_BYTES");
  memset(p, 0x5a, n);
  return n;
}

static int huge = 0;
static int populate = 0; /* pread: fault each step in with MADV_POPULATE_WRITE before reading it */
static const size_t step = (size_t)512 << 10;
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

static unsigned char* fresh(size_t n) {
  void* p = mmap(NULL, n ? n : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) die("mmap");
#ifdef MADV_HUGEPAGE
  if (huge && madvise(p, n ? n : 1, MADV_HUGEPAGE) != 0) die("madvise(MADV_HUGEPAGE)");
#endif
  return p;
}

enum op { OP_MEMCPY, OP_TOUCH, OP_PREAD, OP_WRITE, OP_DIRECT };

struct job {
  enum op op;
  unsigned char* dst;
  const unsigned char* src;
  int fd;
  size_t bytes;
  atomic_size_t next;
  atomic_int failed;
};

static void* worker(void* arg) {
  struct job* j = arg;
  for (;;) {
    size_t off = atomic_fetch_add(&j->next, piece);
    if (off >= j->bytes) return NULL;
    size_t n = j->bytes - off < piece ? j->bytes - off : piece;
    switch (j->op) {
      case OP_MEMCPY: memcpy(j->dst + off, j->src + off, n); break;
      case OP_TOUCH: memset(j->dst + off, 0x5a, n); break;
      case OP_WRITE:
        while (n) {
          ssize_t put = pwrite(j->fd, j->src + off, n, (off_t)off);
          if (put < 0 && errno == EINTR) continue;
          if (put <= 0) {
            atomic_store(&j->failed, 1);
            return NULL;
          }
          off += (size_t)put;
          n -= (size_t)put;
        }
        break;
      case OP_DIRECT:
        /* whole blocks: the last piece is rounded up (the buffer has room), and ends early at end of file */
        n = (n + 4095) & ~(size_t)4095;
        while (n) {
          ssize_t got = pread(j->fd, j->dst + off, n, (off_t)off);
          if (got < 0 && errno == EINTR) continue;
          if (got < 0) {
            atomic_store(&j->failed, 1);
            return NULL;
          }
          if (got == 0 || (size_t)got < n) break; /* end of file */
          off += (size_t)got;
          n -= (size_t)got;
        }
        break;
      case OP_PREAD:
        while (n) {
          size_t want = n;
          if (populate) {
            want = n < step ? n : step;
            /* dst is page-aligned, and so is every step of it (pieces and steps are whole pages) */
            (void)madvise(j->dst + off, want, MADV_POPULATE_WRITE);
          }
          ssize_t got = pread(j->fd, j->dst + off, want, (off_t)off);
          if (got < 0 && errno == EINTR) continue;
          if (got <= 0) {
            atomic_store(&j->failed, 1);
            return NULL;
          }
          off += (size_t)got;
          n -= (size_t)got;
        }
        break;
    }
  }
}

static void run(struct job* j, unsigned threads) {
  pthread_t tid[64];
  atomic_store(&j->next, 0);
  for (unsigned i = 1; i < threads; ++i) {
    if (pthread_create(&tid[i], NULL, worker, j) != 0) die("pthread_create");
  }
  worker(j);
  for (unsigned i = 1; i < threads; ++i) pthread_join(tid[i], NULL);
  if (atomic_load(&j->failed)) {
    fprintf(stderr, "ceilings: pread/pwrite failed or hit end of file\n");
    exit(1);
  }
}

/* One thread keeping `depth` reads of `piece` bytes in flight on an io_uring (raw syscalls): O_DIRECT (pieces
 * rounded up to whole blocks) or through the page cache. Each read must return its whole piece, or up to the end
 * of the file for the last one. */
static void run_uring(struct job* j, unsigned depth) {
  struct io_uring_params p;
  memset(&p, 0, sizeof p);
  int fd = (int)syscall(__NR_io_uring_setup, depth, &p);
  if (fd < 0) die("io_uring_setup");
  size_t sq_size = p.sq_off.array + p.sq_entries * sizeof(unsigned);
  size_t cq_size = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
  unsigned char* sq = mmap(NULL, sq_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, IORING_OFF_SQ_RING);
  unsigned char* cq = mmap(NULL, cq_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, IORING_OFF_CQ_RING);
  struct io_uring_sqe* sqes = mmap(NULL, p.sq_entries * sizeof(struct io_uring_sqe), PROT_READ | PROT_WRITE,
                                   MAP_SHARED | MAP_POPULATE, fd, IORING_OFF_SQES);
  if (sq == MAP_FAILED || cq == MAP_FAILED || sqes == MAP_FAILED) die("mmap io_uring");
  _Atomic unsigned* sq_tail = (_Atomic unsigned*)(sq + p.sq_off.tail);
  unsigned sq_mask = *(unsigned*)(sq + p.sq_off.ring_mask);
  unsigned* sq_array = (unsigned*)(sq + p.sq_off.array);
  _Atomic unsigned* cq_head = (_Atomic unsigned*)(cq + p.cq_off.head);
  _Atomic unsigned* cq_tail = (_Atomic unsigned*)(cq + p.cq_off.tail);
  unsigned cq_mask = *(unsigned*)(cq + p.cq_off.ring_mask);
  struct io_uring_cqe* cqes = (struct io_uring_cqe*)(cq + p.cq_off.cqes);
  size_t next = 0;
  unsigned inflight = 0;
  while (next < j->bytes || inflight) {
    unsigned queued = 0;
    unsigned tail = atomic_load_explicit(sq_tail, memory_order_relaxed);
    while (next < j->bytes && inflight + queued < depth) {
      size_t n = j->bytes - next < piece ? j->bytes - next : piece;
      n = (n + 4095) & ~(size_t)4095;
      unsigned idx = tail & sq_mask;
      struct io_uring_sqe* e = &sqes[idx];
      memset(e, 0, sizeof *e);
      e->opcode = IORING_OP_READ;
      e->fd = j->fd;
      e->addr = (unsigned long long)(uintptr_t)(j->dst + next);
      e->len = (unsigned)n;
      e->off = next;
      e->user_data = next;
      sq_array[idx] = idx;
      ++tail;
      ++queued;
      next += piece;
    }
    atomic_store_explicit(sq_tail, tail, memory_order_release);
    if (syscall(__NR_io_uring_enter, fd, queued, 1, IORING_ENTER_GETEVENTS, NULL, 0) < 0 && errno != EINTR) {
      die("io_uring_enter");
    }
    inflight += queued;
    unsigned head = atomic_load_explicit(cq_head, memory_order_relaxed);
    while (head != atomic_load_explicit(cq_tail, memory_order_acquire)) {
      const struct io_uring_cqe* c = &cqes[head & cq_mask];
      if (c->res < 0) {
        errno = -c->res;
        die("io_uring read");
      }
      size_t want = j->bytes - c->user_data < piece ? j->bytes - c->user_data : piece;
      if ((size_t)c->res < want) {
        errno = EIO;
        die("io_uring read came back short");
      }
      ++head;
      --inflight;
    }
    atomic_store_explicit(cq_head, head, memory_order_release);
  }
  munmap(sq, sq_size);
  munmap(cq, cq_size);
  munmap(sqes, p.sq_entries * sizeof(struct io_uring_sqe));
  close(fd);
}

static void sync_dir_of(const char* path) {
  char dir[4096];
  snprintf(dir, sizeof dir, "%s", path);
  char* slash = strrchr(dir, '/');
  if (slash == NULL)
    snprintf(dir, sizeof dir, ".");
  else if (slash == dir)
    dir[1] = 0;
  else
    *slash = 0;
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0 || fsync(fd) != 0) die("fsync directory");
  close(fd);
}

static int write_file(struct job* j, const char* path, unsigned threads, int reps, int sync) {
  printf("{\"op\": \"write\", \"bytes\": %zu, \"threads\": %u, \"seconds\": [", j->bytes, threads);
  for (int r = 0; r < reps; ++r) {
    unlink(path);
    double t0 = now();
    j->fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (j->fd < 0) die("open for writing");
    run(j, threads);
    if (sync && fsync(j->fd) != 0) die("fsync");
    if (close(j->fd) != 0) die("close");
    if (sync) sync_dir_of(path);
    double t = now() - t0;
    unlink(path);
    printf("%s%.9f", r ? ", " : "", t);
  }
  printf("]}\n");
  return 0;
}

int main(int argc, char** argv) {
  if (argc < 5) {
    fprintf(stderr,
            "usage: ceilings memcpy BYTES THREADS REPS | ceilings touch BYTES THREADS REPS [HUGE [IDLE]] | "
            "ceilings pread FILE THREADS REPS MEMORY [PIECE_MIB] | ceilings uring FILE DEPTH REPS MEMORY | "
            "ceilings direct FILE DEPTH REPS [PIECE_KIB [URING]] | ceilings write FILE BYTES THREADS REPS FSYNC\n");
    return 2;
  }
  const size_t held = hold_memory();
  const char* opname = argv[1];
  unsigned threads = (unsigned)strtoul(argv[3], NULL, 10);
  int reps = atoi(argv[4]);
  if (threads < 1) threads = 1;
  if (threads > 64) threads = 64;
  struct job j;
  memset(&j, 0, sizeof j);
  j.fd = -1;
  int fresh_each = 0;
  int uring = 0; /* uring: THREADS is the queue depth of one thread */
  unsigned idle = 0;
  if (strcmp(opname, "memcpy") == 0) {
    j.op = OP_MEMCPY;
    j.bytes = strtoull(argv[2], NULL, 10);
    unsigned char* src = fresh(j.bytes);
    j.dst = fresh(j.bytes);
    memset(src, 1, j.bytes);
    memset(j.dst, 2, j.bytes);
    j.src = src;
  } else if (strcmp(opname, "touch") == 0) {
    j.op = OP_TOUCH;
    j.bytes = strtoull(argv[2], NULL, 10);
    fresh_each = 1;
    huge = argc > 5 && atoi(argv[5]) != 0;
    idle = argc > 6 ? (unsigned)strtoul(argv[6], NULL, 10) : 0;
  } else if (strcmp(opname, "pread") == 0 || strcmp(opname, "uring") == 0) {
    if (argc < 6) return 2;
    j.op = OP_PREAD;
    uring = strcmp(opname, "uring") == 0;
    j.fd = open(argv[2], O_RDONLY | O_CLOEXEC);
    if (j.fd < 0) die("open");
    struct stat st;
    if (fstat(j.fd, &st) != 0) die("fstat");
    j.bytes = (size_t)st.st_size;
    fresh_each = atoi(argv[5]) != 0;
    huge = atoi(argv[5]) == 2;
    populate = !uring && atoi(argv[5]) == 3;
    if (!uring && argc > 6) {
      size_t mib = strtoull(argv[6], NULL, 10);
      piece = mib ? mib << 20 : (j.bytes ? j.bytes : 1);
    }
    if (!fresh_each) {
      j.dst = fresh(j.bytes);
      memset(j.dst, 0, j.bytes);
    }
  } else if (strcmp(opname, "direct") == 0) {
    j.op = OP_DIRECT;
    j.fd = open(argv[2], O_RDONLY | O_DIRECT | O_CLOEXEC);
    if (j.fd < 0) die("open O_DIRECT");
    struct stat st;
    if (fstat(j.fd, &st) != 0) die("fstat");
    j.bytes = (size_t)st.st_size;
    if (argc > 5) piece = (size_t)strtoull(argv[5], NULL, 10) << 10;
    if (piece == 0 || piece % 4096) piece = (size_t)8 << 20;
    uring = argc > 6 && atoi(argv[6]) != 0;
    size_t room = (j.bytes + piece + 4095) & ~(size_t)4095;
    j.dst = fresh(room);
    memset(j.dst, 0, room);
    printf("{\"op\": \"direct\", \"bytes\": %zu, \"threads\": %u, \"uring\": %d, \"piece\": %zu, \"seconds\": [",
           j.bytes, threads, uring, piece);
    for (int r = 0; r < reps; ++r) {
      double t0 = now();
      if (uring) {
        run_uring(&j, threads);
      } else {
        run(&j, threads);
      }
      printf("%s%.9f", r ? ", " : "", now() - t0);
    }
    printf("]}\n");
    return 0;
  } else if (strcmp(opname, "write") == 0) {
    if (argc < 7) return 2;
    j.op = OP_WRITE;
    j.bytes = strtoull(argv[3], NULL, 10);
    threads = (unsigned)strtoul(argv[4], NULL, 10);
    if (threads < 1) threads = 1;
    if (threads > 64) threads = 64;
    reps = atoi(argv[5]);
    unsigned char* src = fresh(j.bytes);
    memset(src, 0x5a, j.bytes);
    j.src = src;
    return write_file(&j, argv[2], threads, reps, atoi(argv[6]) != 0);
  } else {
    fprintf(stderr, "ceilings: unknown op %s\n", opname);
    return 2;
  }
  printf("{\"op\": \"%s\", \"bytes\": %zu, \"threads\": %u, \"seconds\": [", opname, j.bytes, threads);
  struct rusage before, after;
  double busy = 0, kernel = 0, late = 0;
  long faults = 0;
  const char* start_at = getenv("CEILINGS_START_AT");
  for (int r = 0; r < reps; ++r) {
    if (idle) sleep(idle);
    if (r == 0 && start_at && *start_at) late = wait_until(strtod(start_at, NULL));
    getrusage(RUSAGE_SELF, &before);
    double t0 = now();
    if (fresh_each) j.dst = fresh(j.bytes);
    if (uring) {
      run_uring(&j, threads);
    } else {
      run(&j, threads);
    }
    double t = now() - t0;
    getrusage(RUSAGE_SELF, &after);
    faults += after.ru_minflt - before.ru_minflt;
    busy += seconds_of(after.ru_utime) - seconds_of(before.ru_utime);
    kernel += seconds_of(after.ru_stime) - seconds_of(before.ru_stime);
    if (fresh_each) munmap(j.dst, j.bytes ? j.bytes : 1);
    printf("%s%.9f", r ? ", " : "", t);
  }
  printf(
      "], \"minor_faults\": %ld, \"user_seconds\": %.6f, \"sys_seconds\": %.6f, \"late_seconds\": %.6f, "
      "\"held_bytes\": %zu}\n",
      faults, busy, kernel, late, held);
  return 0;
}

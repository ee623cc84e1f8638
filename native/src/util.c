/* Time helpers and a time-boxed child process runner (used for rdma_ctl). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

extern char **environ;

uint64_t orch_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t orch_wall_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000ull + (uint64_t)ts.tv_nsec / 1000000ull;
}

void orch_copy(char *dst, size_t cap, const char *src) {
  if (!cap) return;
  size_t n = src ? strlen(src) : 0;
  if (n >= cap) n = cap - 1;
  if (n) memcpy(dst, src, n);
  dst[n] = '\0';
}

int32_t orch_run_cmd(const char *const argv[], uint32_t timeout_ms, char *out, size_t cap, int *exit_code) {
  if (!argv || !argv[0] || !out || cap == 0) return ORCH_ERR_INVALID_ARG;
  out[0] = '\0';
  if (exit_code) *exit_code = -1;
  int fds[2];
  if (pipe(fds) != 0) return ORCH_ERR_IO;
  fcntl(fds[0], F_SETFD, FD_CLOEXEC);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  pid_t pid;
  int rc = posix_spawn(&pid, argv[0], &fa, NULL, (char *const *)argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    return ORCH_ERR_IO;
  }
  uint64_t deadline = orch_now_ns() + (uint64_t)timeout_ms * 1000000ull;
  size_t len = 0;
  int32_t status = ORCH_OK;
  for (;;) {
    uint64_t now = orch_now_ns();
    if (now >= deadline) {
      status = ORCH_ERR_TIMEOUT;
      break;
    }
    struct pollfd p = {.fd = fds[0], .events = POLLIN};
    int pr = poll(&p, 1, (int)((deadline - now) / 1000000ull) + 1);
    if (pr < 0 && errno == EINTR) continue;
    if (pr <= 0) continue; /* re-checks the deadline */
    char tmp[512];
    ssize_t n = read(fds[0], tmp, sizeof tmp);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break; /* EOF */
    size_t take = (size_t)n;
    if (len + take > cap - 1) take = cap - 1 - len;
    memcpy(out + len, tmp, take);
    len += take;
  }
  out[len] = '\0';
  close(fds[0]);
  int ws = 0;
  if (status == ORCH_ERR_TIMEOUT) {
    kill(pid, SIGKILL);
    waitpid(pid, &ws, 0);
    return status;
  }
  /* Output closed: give the child the rest of the budget to exit. */
  for (;;) {
    pid_t w = waitpid(pid, &ws, WNOHANG);
    if (w == pid) break;
    if (w < 0 && errno != EINTR) return ORCH_ERR_IO;
    if (orch_now_ns() >= deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &ws, 0);
      return ORCH_ERR_TIMEOUT;
    }
    struct timespec ts = {0, 2000000};
    nanosleep(&ts, NULL);
  }
  if (exit_code) *exit_code = WIFEXITED(ws) ? WEXITSTATUS(ws) : -1;
  return ORCH_OK;
}

/* The pod sandbox's process (e2e/realnode/image.sh): holds the pod's namespaces, reaps orphans,
 * ends on SIGINT or SIGTERM. No registry is reachable, so the lab builds its own pause image. */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static void quit(int sig) { (void)sig; _exit(0); }
static void reap(int sig) { (void)sig; while (waitpid(-1, 0, WNOHANG) > 0) {} }

int main(void) {
    signal(SIGINT, quit);
    signal(SIGTERM, quit);
    signal(SIGCHLD, reap);
    for (;;) pause();
}

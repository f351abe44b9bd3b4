// pause holds a pod's namespaces open as the sandbox's first process: it reaps the zombies that
// pods sharing its PID namespace leave behind, exits on SIGINT or SIGTERM, and otherwise waits.
// Built static (CGO_ENABLED=0) into the lab's sandbox image by superkube.lab.images.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 16)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	// written once the handlers are ours: until then the Go runtime's own end the process on SIGTERM
	if os.Getpid() != 1 {
		fmt.Fprintln(os.Stderr, "pause: warning: not PID 1; zombies of this namespace are not mine to reap")
	}
	for s := range signals {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var status syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}

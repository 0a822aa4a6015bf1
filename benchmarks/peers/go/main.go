// SPDX-License-Identifier: BSL-1.0
// The Go side of `make bench-peers` (benchmarks/peers.py); the same command
// line and answer as benchmarks/peers/sluice_peer.cpp. Run with GOMAXPROCS=1
// (one P: the one-thread loop the others run on).
//
//	go_peer go <workload> <kind> <n>
//	  fanout   errgroup.Group with SetLimit(100); g.Go blocks while 100 run
//	           (lazy); each goroutine stores task(i) in results[i]; sum after Wait
//	  stream   errgroup SetLimit(64) producers send task(i) on a channel of 64;
//	           the main goroutine sums as results arrive (unordered)
//	  handoff  two goroutines ping-pong through two semaphore.Weighted(1) that
//	           start fully acquired (n hand-offs in all)
//	  kind     immediate: task(i) returns i+1; suspending: runtime.Gosched() first
package main

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sync/semaphore"
)

func cpuNs() int64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru.Utime.Nano() + ru.Stime.Nano()
}

var suspending bool

func task(i int64) int64 {
	if suspending {
		runtime.Gosched()
	}
	return i + 1
}

func fanout(n int64) int64 {
	results := make([]int64, n)
	var g errgroup.Group
	g.SetLimit(100)
	for i := int64(0); i < n; i++ {
		i := i
		g.Go(func() error {
			results[i] = task(i)
			return nil
		})
	}
	g.Wait()
	var sum int64
	for _, r := range results {
		sum += r
	}
	return sum
}

func stream(n int64) int64 {
	out := make(chan int64, 64)
	go func() {
		var g errgroup.Group
		g.SetLimit(64)
		for i := int64(0); i < n; i++ {
			i := i
			g.Go(func() error {
				out <- task(i)
				return nil
			})
		}
		g.Wait()
		close(out)
	}()
	var sum int64
	for r := range out {
		sum += r
	}
	return sum
}

func handoff(n int64) (int64, int64) {
	ctx := context.Background()
	sems := [2]*semaphore.Weighted{semaphore.NewWeighted(1), semaphore.NewWeighted(1)}
	sems[0].Acquire(ctx, 1)
	sems[1].Acquire(ctx, 1)
	var waiting [2]bool
	var sum, handoffs int64
	done := make(chan struct{}, 2)
	player := func(me int) {
		for {
			waiting[me] = true
			sems[me].Acquire(ctx, 1)
			waiting[me] = false
			if sum >= n {
				sems[1-me].Release(1)
				done <- struct{}{}
				return
			}
			sum++
			if waiting[1-me] {
				handoffs++
			}
			sems[1-me].Release(1)
		}
	}
	go player(0)
	go player(1)
	sems[0].Release(1)
	<-done
	<-done
	return sum, handoffs
}

// peakRSS is VmHWM (KiB): the process's own peak resident set.
func peakRSS() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return -1
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmHWM:") {
			f := strings.Fields(l)
			v, _ := strconv.ParseInt(f[1], 10, 64)
			return v
		}
	}
	return -1
}

func main() {
	if len(os.Args) < 5 {
		fmt.Fprintln(os.Stderr, "usage: go_peer go fanout|stream|handoff immediate|suspending N")
		os.Exit(2)
	}
	runtime.GOMAXPROCS(1)
	workload, kind := os.Args[2], os.Args[3]
	n, err := strconv.ParseInt(os.Args[4], 10, 64)
	if err != nil || n <= 0 || (kind != "immediate" && kind != "suspending") {
		os.Exit(2)
	}
	suspending = kind == "suspending"
	var sum, handoffs int64
	t0 := cpuNs()
	switch workload {
	case "fanout":
		sum = fanout(n)
	case "stream":
		sum = stream(n)
	case "handoff":
		sum, handoffs = handoff(n)
	default:
		os.Exit(2)
	}
	t1 := cpuNs()
	fmt.Printf("{\"ns\": %.3f, \"sum\": %d, \"handoffs\": %d, \"rss_kib\": %d}\n", float64(t1-t0)/float64(n), sum, handoffs, peakRSS())
}

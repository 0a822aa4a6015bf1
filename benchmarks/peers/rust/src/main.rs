// SPDX-License-Identifier: BSL-1.0
// The Rust side of `make bench-peers` (benchmarks/peers.py); the same command
// line and answer as benchmarks/peers/sluice_peer.cpp. One tokio
// current_thread runtime.
//
//   tokio_peer tokio <workload> <kind> <n>
//     fanout   stream::iter(0..n).map(task).buffered(100), results in order,
//              summed as they come (lazy: 100 futures in flight)
//     stream   the same with buffer_unordered(64), summed by for_each
//     handoff  two spawned tasks ping-pong through two tokio::sync::Semaphore(0)
//              (acquire().await, forget(), add_permits(1)); n hand-offs in all
//     kind     immediate: task(i) returns i+1; suspending: tokio::task::yield_now() first
use futures::stream::{self, StreamExt};
use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;
use tokio::sync::Semaphore;

#[repr(C)]
struct Timespec {
    tv_sec: i64,
    tv_nsec: i64,
}
extern "C" {
    fn clock_gettime(clk: i32, ts: *mut Timespec) -> i32;
}
fn cpu_ns() -> i64 {
    let mut ts = Timespec { tv_sec: 0, tv_nsec: 0 };
    unsafe { clock_gettime(2 /* CLOCK_PROCESS_CPUTIME_ID */, &mut ts) };
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}

/// VmHWM (KiB): the process's own peak resident set.
fn peak_rss_kib() -> i64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(-1)
}

async fn task(i: i64, suspending: bool) -> i64 {
    if suspending {
        tokio::task::yield_now().await;
    }
    i + 1
}

async fn fanout(n: i64, s: bool) -> i64 {
    stream::iter(0..n)
        .map(|i| task(i, s))
        .buffered(100)
        .fold(0i64, |acc, x| async move { acc + x })
        .await
}

async fn stream_unordered(n: i64, s: bool) -> i64 {
    let sum = Cell::new(0i64);
    stream::iter(0..n)
        .map(|i| task(i, s))
        .buffer_unordered(64)
        .for_each(|x| {
            sum.set(sum.get() + x);
            async {}
        })
        .await;
    sum.get()
}

async fn handoff(n: i64) -> (i64, i64) {
    let sems = Arc::new([Semaphore::new(0), Semaphore::new(0)]);
    let waiting = Rc::new([Cell::new(false), Cell::new(false)]);
    let sum = Rc::new(Cell::new(0i64));
    let handoffs = Rc::new(Cell::new(0i64));
    let local = tokio::task::LocalSet::new();
    for me in 0..2usize {
        let (sems, waiting, sum, handoffs) =
            (sems.clone(), waiting.clone(), sum.clone(), handoffs.clone());
        local.spawn_local(async move {
            loop {
                waiting[me].set(true);
                sems[me].acquire().await.unwrap().forget();
                waiting[me].set(false);
                if sum.get() >= n {
                    sems[1 - me].add_permits(1);
                    return;
                }
                sum.set(sum.get() + 1);
                if waiting[1 - me].get() {
                    handoffs.set(handoffs.get() + 1);
                }
                sems[1 - me].add_permits(1);
            }
        });
    }
    sems[0].add_permits(1);
    local.await;
    (sum.get(), handoffs.get())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 5 {
        eprintln!("usage: tokio_peer tokio fanout|stream|handoff immediate|suspending N");
        std::process::exit(2);
    }
    let (workload, kind) = (args[2].as_str(), args[3].as_str());
    let n: i64 = args[4].parse().expect("n");
    if n <= 0 || (kind != "immediate" && kind != "suspending") {
        std::process::exit(2);
    }
    let s = kind == "suspending";
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let t0 = cpu_ns();
    let (sum, handoffs) = rt.block_on(async {
        match workload {
            "fanout" => (fanout(n, s).await, 0),
            "stream" => (stream_unordered(n, s).await, 0),
            "handoff" => handoff(n).await,
            _ => std::process::exit(2),
        }
    });
    let t1 = cpu_ns();
    println!(
        "{{\"ns\": {:.3}, \"sum\": {}, \"handoffs\": {}, \"rss_kib\": {}}}",
        (t1 - t0) as f64 / n as f64,
        sum,
        handoffs,
        peak_rss_kib()
    );
}

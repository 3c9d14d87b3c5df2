//! The simulator's clock: virtual time inside a [`VirtualRuntime`], tokio's
//! clock everywhere else.
//!
//! A [`VirtualRuntime`] is a small single-threaded executor whose clock only
//! moves when every task is waiting: it then jumps to the earliest timer. A
//! minute of simulated GPU work takes milliseconds, and a run is
//! deterministic (tasks run in the order they were woken, timers fire in
//! deadline order, ties in the order they were set). It needs nothing from
//! tokio but its runtime-agnostic parts (`tokio::sync`), so the `sim`
//! feature does not switch on tokio's `test-util` in your build.
//!
//! The functions here ([`now`], [`sleep_until`], [`sleep`], [`spawn`]) use
//! the virtual clock when called from a task of a [`VirtualRuntime`] and
//! tokio's otherwise, so the same [`SimEngine`](super::SimEngine) serves a
//! real server (on tokio, in real time) and a simulation (in virtual time).
//! Code that runs in virtual time must take the time from [`now`], not from
//! `tokio::time::Instant::now()` or `std::time::Instant::now()`, which read
//! the wall clock.
//!
//! ```
//! use std::time::Duration;
//! use tower_admission_sim::{self as sim, VirtualRuntime};
//!
//! let runtime = VirtualRuntime::new();
//! let wall = std::time::Instant::now();
//! runtime.block_on(async {
//!     let start = sim::now();
//!     sim::sleep(Duration::from_secs(3600)).await;
//!     assert_eq!(sim::now() - start, Duration::from_secs(3600));
//! });
//! assert!(wall.elapsed() < Duration::from_secs(60));
//! ```

use std::cell::{Cell, RefCell};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use slab::Slab;
use tokio::time::Instant;

type Task = Pin<Box<dyn Future<Output = ()> + Send>>;

thread_local! {
    /// The virtual runtime whose `block_on` runs on this thread, if any.
    static CURRENT: RefCell<Option<Arc<Shared>>> = const { RefCell::new(None) };
}

/// A single-threaded executor with a virtual clock (see the
/// [module docs](self)).
///
/// Futures run by [`block_on`](Self::block_on), and the tasks they
/// [`spawn`], see the virtual clock through [`now`] and [`sleep_until`]. Tasks
/// still running when `block_on` returns stay, and go on in the next
/// `block_on`; dropping the runtime drops them.
pub struct VirtualRuntime {
    shared: Arc<Shared>,
    tasks: RefCell<Slab<Slot>>,
    /// Tasks spawned so far: the generation of the next one.
    spawned: Cell<u64>,
}

struct Slot {
    future: Task,
    waker: Arc<TaskWaker>,
}

/// What the runtime, its tasks and their sleeps share.
struct Shared {
    /// The wall-clock instant that virtual time 0 is pinned to, so that
    /// virtual instants are ordinary [`Instant`]s.
    base: Instant,
    core: Mutex<Core>,
    ready: Arc<ReadyQueue>,
}

#[derive(Default)]
struct Core {
    /// Virtual time since `base`.
    elapsed: Duration,
    /// Deadlines of the sleeps, by deadline then by id (the order they were
    /// set); entries whose sleep is gone are skipped when they come up.
    timers: BinaryHeap<Reverse<(Duration, u64)>>,
    /// The waker of each pending sleep.
    sleepers: HashMap<u64, Waker>,
    next_timer: u64,
    /// Tasks spawned since the runtime last took them in.
    spawned: Vec<Task>,
}

/// Tasks woken and not yet polled, in the order they were woken:
/// `(slot, generation)`, so that a waker of a finished task cannot poll the
/// task that reused its slot.
#[derive(Default)]
struct ReadyQueue(Mutex<VecDeque<(usize, u64)>>);

/// The slot of the future passed to `block_on`.
const MAIN: usize = usize::MAX;

struct TaskWaker {
    slot: usize,
    generation: u64,
    /// In the ready queue already: a second wake before the poll adds
    /// nothing.
    queued: AtomicBool,
    ready: Arc<ReadyQueue>,
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if !self.queued.swap(true, Ordering::AcqRel) {
            lock(&self.ready.0).push_back((self.slot, self.generation));
        }
    }
}

impl fmt::Debug for VirtualRuntime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VirtualRuntime")
            .field("elapsed", &lock(&self.shared.core).elapsed)
            .field("tasks", &self.tasks.borrow().len())
            .finish()
    }
}

impl Default for VirtualRuntime {
    fn default() -> Self {
        VirtualRuntime::new()
    }
}

impl VirtualRuntime {
    /// A runtime whose virtual clock reads the wall clock's now, and stands
    /// still until its tasks wait on timers.
    pub fn new() -> VirtualRuntime {
        VirtualRuntime {
            shared: Arc::new(Shared {
                base: Instant::now(),
                core: Mutex::new(Core::default()),
                ready: Arc::new(ReadyQueue::default()),
            }),
            tasks: RefCell::new(Slab::new()),
            spawned: Cell::new(0),
        }
    }

    /// Virtual time elapsed since the runtime was made.
    pub fn elapsed(&self) -> Duration {
        lock(&self.shared.core).elapsed
    }

    /// Runs `future` to completion, with the tasks it spawns, in virtual
    /// time: whenever no task can make progress, the clock jumps to the
    /// earliest sleep's deadline.
    ///
    /// # Panics
    ///
    /// If `future` is still pending when no task can make progress and no
    /// sleep is pending (it would wait forever), if a task panics, or if
    /// called from a task of this runtime.
    pub fn block_on<F: Future>(&self, future: F) -> F::Output {
        let _enter = Enter::new(&self.shared);
        let mut future = pin!(future);
        let main = Arc::new(TaskWaker {
            slot: MAIN,
            generation: 0,
            queued: AtomicBool::new(true),
            ready: Arc::clone(&self.shared.ready),
        });
        let main_waker = Waker::from(Arc::clone(&main));
        lock(&self.shared.ready.0).push_back((MAIN, 0));
        let mut tasks = self
            .tasks
            .try_borrow_mut()
            .expect("VirtualRuntime::block_on called from one of its own tasks");
        loop {
            self.take_in_spawned(&mut tasks);
            let next = lock(&self.shared.ready.0).pop_front();
            match next {
                Some((MAIN, _)) => {
                    main.queued.store(false, Ordering::Release);
                    let mut cx = Context::from_waker(&main_waker);
                    if let Poll::Ready(output) = future.as_mut().poll(&mut cx) {
                        return output;
                    }
                }
                Some((slot, generation)) => {
                    let Some(task) = tasks.get_mut(slot) else {
                        continue;
                    };
                    if task.waker.generation != generation {
                        continue;
                    }
                    task.waker.queued.store(false, Ordering::Release);
                    let waker = Waker::from(Arc::clone(&task.waker));
                    let mut cx = Context::from_waker(&waker);
                    if task.future.as_mut().poll(&mut cx).is_ready() {
                        drop(tasks.remove(slot));
                    }
                }
                None => assert!(
                    self.advance(),
                    "VirtualRuntime::block_on: the future waits forever \
                     (no task can make progress and no sleep is pending)"
                ),
            }
        }
    }

    /// Spawns a task on this runtime; it runs in the next
    /// [`block_on`](Self::block_on) (from inside one, use [`spawn`]).
    pub fn spawn<F>(&self, future: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        lock(&self.shared.core).spawned.push(Box::pin(future));
    }

    fn take_in_spawned(&self, tasks: &mut Slab<Slot>) {
        let spawned = std::mem::take(&mut lock(&self.shared.core).spawned);
        if spawned.is_empty() {
            return;
        }
        let mut ready = lock(&self.shared.ready.0);
        for future in spawned {
            let entry = tasks.vacant_entry();
            let slot = entry.key();
            // A fresh generation for each task: the runtime's spawn count.
            let generation = self.spawned.get() + 1;
            self.spawned.set(generation);
            entry.insert(Slot {
                future,
                waker: Arc::new(TaskWaker {
                    slot,
                    generation,
                    queued: AtomicBool::new(true),
                    ready: Arc::clone(&self.shared.ready),
                }),
            });
            ready.push_back((slot, generation));
        }
    }

    /// Moves the clock to the earliest pending sleep's deadline and wakes
    /// every sleep due then. `false` if no sleep is pending.
    fn advance(&self) -> bool {
        let mut due = Vec::new();
        {
            let mut core = lock(&self.shared.core);
            while let Some(&Reverse((deadline, id))) = core.timers.peek() {
                if !due.is_empty() && deadline > core.elapsed {
                    break;
                }
                core.timers.pop();
                if let Some(waker) = core.sleepers.remove(&id) {
                    core.elapsed = core.elapsed.max(deadline);
                    due.push(waker);
                }
            }
        }
        let woke = !due.is_empty();
        for waker in due {
            waker.wake();
        }
        woke
    }
}

impl Drop for VirtualRuntime {
    fn drop(&mut self) {
        // Tasks hold the runtime's shared state (through their sleeps and
        // engines), so they must go for it to go. Dropping one may wake or
        // spawn others: repeat until nothing is left.
        let _enter = Enter::new(&self.shared);
        loop {
            let tasks = std::mem::take(&mut *self.tasks.borrow_mut());
            let spawned = std::mem::take(&mut lock(&self.shared.core).spawned);
            if tasks.is_empty() && spawned.is_empty() {
                break;
            }
            drop(tasks);
            drop(spawned);
        }
        let mut core = lock(&self.shared.core);
        core.sleepers.clear();
        core.timers.clear();
    }
}

/// Marks this thread as running a virtual runtime, until dropped.
struct Enter {
    previous: Option<Arc<Shared>>,
}

impl Enter {
    fn new(shared: &Arc<Shared>) -> Enter {
        let previous = CURRENT.with(|current| current.replace(Some(Arc::clone(shared))));
        Enter { previous }
    }
}

impl Drop for Enter {
    fn drop(&mut self) {
        let previous = self.previous.take();
        CURRENT.with(|current| *current.borrow_mut() = previous);
    }
}

fn current() -> Option<Arc<Shared>> {
    CURRENT.with(|current| current.borrow().clone())
}

/// The current time: virtual inside a [`VirtualRuntime`], tokio's
/// `Instant::now()` otherwise.
pub fn now() -> Instant {
    match current() {
        Some(shared) => shared.base + lock(&shared.core).elapsed,
        None => Instant::now(),
    }
}

/// Waits until `deadline` on the current clock (see [`now`]): the clock of
/// where the sleep is made, not of where it is awaited.
pub fn sleep_until(deadline: Instant) -> Sleep {
    match current() {
        Some(shared) => Sleep(SleepInner::Virtual {
            deadline: deadline.saturating_duration_since(shared.base),
            shared,
            id: None,
        }),
        None => Sleep(SleepInner::Tokio(Box::pin(tokio::time::sleep_until(
            deadline,
        )))),
    }
}

/// Waits for `duration` on the current clock (see [`now`]).
pub fn sleep(duration: Duration) -> Sleep {
    sleep_until(now() + duration)
}

/// Runs `future` as a task of the current [`VirtualRuntime`], or with
/// `tokio::spawn` outside one.
///
/// # Panics
///
/// Outside both a virtual runtime and a tokio runtime.
pub fn spawn<F>(future: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    match current() {
        Some(shared) => lock(&shared.core).spawned.push(Box::pin(future)),
        None => drop(tokio::spawn(future)),
    }
}

/// Runs `future` until `deadline` on the current clock: `None` if the
/// deadline came first (the future is dropped).
pub(crate) async fn timeout_at<F: Future>(deadline: Instant, future: F) -> Option<F::Output> {
    let mut future = pin!(future);
    let mut sleep = sleep_until(deadline);
    std::future::poll_fn(|cx| {
        if let Poll::Ready(output) = future.as_mut().poll(cx) {
            return Poll::Ready(Some(output));
        }
        match Pin::new(&mut sleep).poll(cx) {
            Poll::Ready(()) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    })
    .await
}

/// The future of [`sleep_until`] and [`sleep`].
#[must_use = "a sleep does nothing unless awaited"]
pub struct Sleep(SleepInner);

enum SleepInner {
    Tokio(Pin<Box<tokio::time::Sleep>>),
    Virtual {
        shared: Arc<Shared>,
        /// Virtual time since the runtime's base.
        deadline: Duration,
        /// Its timer, once it waits.
        id: Option<u64>,
    },
}

impl fmt::Debug for Sleep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            SleepInner::Tokio(sleep) => f.debug_tuple("Sleep").field(sleep).finish(),
            SleepInner::Virtual { deadline, .. } => f
                .debug_struct("Sleep")
                .field("virtual_deadline", deadline)
                .finish(),
        }
    }
}

impl Future for Sleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        match &mut self.get_mut().0 {
            SleepInner::Tokio(sleep) => sleep.as_mut().poll(cx),
            SleepInner::Virtual {
                shared,
                deadline,
                id,
            } => {
                let mut core = lock(&shared.core);
                if core.elapsed >= *deadline {
                    if let Some(id) = id.take() {
                        core.sleepers.remove(&id);
                    }
                    return Poll::Ready(());
                }
                match *id {
                    Some(timer) => {
                        if let Some(waker) = core.sleepers.get_mut(&timer) {
                            waker.clone_from(cx.waker());
                        } else {
                            // Fired by `advance` (which moved the clock to
                            // its deadline) is the only way out of the map,
                            // and then the clock is past it: unreachable,
                            // but set it again rather than hang.
                            core.sleepers.insert(timer, cx.waker().clone());
                            core.timers.push(Reverse((*deadline, timer)));
                        }
                    }
                    None => {
                        core.next_timer += 1;
                        let timer = core.next_timer;
                        core.sleepers.insert(timer, cx.waker().clone());
                        core.timers.push(Reverse((*deadline, timer)));
                        *id = Some(timer);
                    }
                }
                Poll::Pending
            }
        }
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        if let SleepInner::Virtual {
            shared,
            id: Some(id),
            ..
        } = &self.0
        {
            lock(&shared.core).sleepers.remove(id);
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // No code that can panic runs while these locks are held.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn sleeps_end_in_deadline_order_and_the_clock_jumps() {
        let runtime = VirtualRuntime::new();
        let order = Arc::new(Mutex::new(Vec::new()));
        runtime.block_on(async {
            let start = now();
            for (name, ms) in [("c", 30), ("a", 10), ("b", 20), ("a2", 10)] {
                let order = Arc::clone(&order);
                spawn(async move {
                    sleep(Duration::from_millis(ms)).await;
                    lock(&order).push((name, (now() - start).as_millis()));
                });
            }
            sleep(Duration::from_millis(25)).await;
            assert_eq!(now() - start, Duration::from_millis(25));
        });
        // The task of 30 ms has not run yet: block_on returned at 25 ms.
        assert_eq!(*lock(&order), [("a", 10), ("a2", 10), ("b", 20)]);
        runtime.block_on(async { sleep(Duration::from_millis(10)).await });
        assert_eq!(lock(&order).last(), Some(&("c", 30)));
        assert_eq!(runtime.elapsed(), Duration::from_millis(35));
    }

    #[test]
    fn a_dropped_sleep_never_fires_and_timeouts_work() {
        let runtime = VirtualRuntime::new();
        runtime.block_on(async {
            let start = now();
            let early = timeout_at(start + Duration::from_secs(1), async {
                sleep(Duration::from_secs(5)).await;
            })
            .await;
            assert_eq!(early, None);
            assert_eq!(now() - start, Duration::from_secs(1));
            let done = timeout_at(start + Duration::from_secs(10), async { 7 }).await;
            assert_eq!(done, Some(7));
            // The 5 s sleep was dropped: the next wake-up is at 3 s.
            sleep_until(start + Duration::from_secs(3)).await;
            assert_eq!(now() - start, Duration::from_secs(3));
        });
    }

    #[test]
    fn tokio_sync_works_across_tasks() {
        let runtime = VirtualRuntime::new();
        let received = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&received);
        runtime.block_on(async move {
            let (sender, mut receiver) = tokio::sync::mpsc::unbounded_channel();
            spawn(async move {
                for n in 0..5 {
                    sleep(Duration::from_millis(100)).await;
                    sender.send(n).unwrap();
                }
            });
            while let Some(n) = receiver.recv().await {
                count.fetch_add(n, Ordering::Relaxed);
            }
        });
        assert_eq!(received.load(Ordering::Relaxed), 10);
        assert_eq!(runtime.elapsed(), Duration::from_millis(500));
    }

    #[test]
    #[should_panic(expected = "waits forever")]
    fn waiting_forever_panics_instead_of_hanging() {
        VirtualRuntime::new().block_on(std::future::pending::<()>());
    }

    #[test]
    fn dropping_the_runtime_drops_its_tasks() {
        let alive = Arc::new(());
        let runtime = VirtualRuntime::new();
        let held = Arc::clone(&alive);
        runtime.block_on(async move {
            spawn(async move {
                let _held = held;
                std::future::pending::<()>().await;
            });
            sleep(Duration::from_millis(1)).await;
        });
        assert_eq!(Arc::strong_count(&alive), 2);
        drop(runtime);
        assert_eq!(Arc::strong_count(&alive), 1);
    }
}

//! The sending side of a platform that delivers by webhook, for the kits
//! of such platforms: deliveries are posted one after another, in the
//! order they were queued, to the gateway's shared listener, and each is
//! posted again until the listener takes it, as the platforms retry a
//! delivery that found the receiver down (a refused connection) or not yet
//! ready (`503` while no adapter run is attached).
//!
//! The kits' `push_*` methods are synchronous, like pushing an update into
//! a fake's queue; the posting happens on a task of the test's runtime.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::lock;
use crate::wait::Changes;

/// How long the sender waits before posting a refused delivery again.
const RETRY: Duration = Duration::from_millis(50);

/// One delivery: where it goes and what it carries.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// The full URL on the listener.
    pub url: String,
    /// Headers beyond the content type (signatures, tokens).
    pub headers: Vec<(String, String)>,
    /// The `Content-Type`.
    pub content_type: String,
    /// The body as sent.
    pub body: Vec<u8>,
}

/// What the listener answered a delivery it took.
#[derive(Debug, Clone, PartialEq)]
pub struct Taken {
    /// The HTTP status.
    pub status: u16,
    /// The `Content-Type`, when set.
    pub content_type: Option<String>,
    /// The body.
    pub body: String,
    /// When the answer arrived.
    pub at: std::time::Instant,
}

#[derive(Default)]
struct Shared {
    taken: Mutex<Vec<Taken>>,
    /// Deliveries queued so far.
    pushed: std::sync::atomic::AtomicUsize,
    changes: Changes,
}

/// Posts queued deliveries in order (see the module docs); stops when
/// dropped.
pub struct Sender {
    queue: mpsc::UnboundedSender<Delivery>,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl Sender {
    /// Starts the posting task on the current runtime.
    ///
    /// # Panics
    /// Outside a Tokio runtime.
    pub fn start() -> Sender {
        let (queue, mut rx) = mpsc::unbounded_channel::<Delivery>();
        let shared = Arc::new(Shared::default());
        let record = shared.clone();
        let task = tokio::spawn(async move {
            let http = reqwest::Client::new();
            while let Some(delivery) = rx.recv().await {
                let taken = post_until_taken(&http, &delivery).await;
                lock(&record.taken).push(taken);
                record.changes.bump();
            }
        });
        Sender {
            queue,
            shared,
            task,
        }
    }

    /// Queues `delivery` behind the ones before it.
    pub fn push(&self, delivery: Delivery) {
        self.shared
            .pushed
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        // The task only ends when the sender is dropped, so the queue is
        // open for as long as `self` exists.
        let _ = self.queue.send(delivery);
    }

    /// Deliveries queued and not yet taken by the listener.
    pub fn pending(&self) -> usize {
        let pushed = self.shared.pushed.load(std::sync::atomic::Ordering::SeqCst);
        pushed.saturating_sub(lock(&self.shared.taken).len())
    }

    /// Waits until the listener took every delivery queued so far.
    ///
    /// # Panics
    /// When [`crate::wait::WAIT`] passes first.
    pub async fn wait_all_taken(&self) {
        let n = self.shared.pushed.load(std::sync::atomic::Ordering::SeqCst);
        self.wait_taken(n).await;
    }

    /// What the listener answered each delivery it took, in order.
    pub fn taken(&self) -> Vec<Taken> {
        lock(&self.shared.taken).clone()
    }

    /// Waits until the listener took `n` deliveries in total; returns
    /// their answers.
    ///
    /// # Panics
    /// When [`crate::wait::WAIT`] passes first.
    pub async fn wait_taken(&self, n: usize) -> Vec<Taken> {
        self.shared
            .changes
            .expect(
                &format!("{n} deliveries taken"),
                crate::wait::WAIT,
                || {
                    let taken = self.taken();
                    (taken.len() >= n).then_some(taken)
                },
                || self.taken(),
            )
            .await
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Posts until the answer is neither a refused connection nor a `5xx`.
async fn post_until_taken(http: &reqwest::Client, delivery: &Delivery) -> Taken {
    loop {
        let mut request = http
            .post(&delivery.url)
            .header(reqwest::header::CONTENT_TYPE, &delivery.content_type)
            .body(delivery.body.clone());
        for (name, value) in &delivery.headers {
            request = request.header(name, value);
        }
        if let Ok(response) = request.send().await {
            let status = response.status().as_u16();
            if status < 500 {
                let content_type = response
                    .headers()
                    .get(reqwest::header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned);
                let body = response.text().await.unwrap_or_default();
                return Taken {
                    status,
                    content_type,
                    body,
                    at: std::time::Instant::now(),
                };
            }
        }
        tokio::time::sleep(RETRY).await;
    }
}

/// A free port on 127.0.0.1 for the gateway's shared listener. The kit
/// names it in its section, so every gateway it runs (in process or as a
/// restarted `talaria gateway run`) listens where its sender posts.
///
/// # Panics
/// When no local port can be bound (a broken test environment).
pub fn free_port() -> u16 {
    match std::net::TcpListener::bind(("127.0.0.1", 0)).and_then(|l| l.local_addr()) {
        Ok(addr) => addr.port(),
        Err(e) => panic!("no free port on 127.0.0.1: {e}"),
    }
}

/// The gateways a kit saw come up on its listener, for a platform whose
/// adapter makes no call of its own when it starts: a gateway has
/// "connected" once the listener's `/health` says it takes deliveries.
///
/// The suites read [`PlatformKit::connections`](super::PlatformKit) only
/// while no gateway runs (before the first start, after a stop or a
/// kill), so a listener found up afterwards is a new gateway's; the
/// counter refuses to count one that was never seen down.
pub struct Arrivals {
    port: u16,
    count: std::sync::atomic::AtomicUsize,
    seen_down: std::sync::atomic::AtomicBool,
}

impl Arrivals {
    /// Counts the gateways on `port` of 127.0.0.1.
    pub fn new(port: u16) -> Arrivals {
        Arrivals {
            port,
            count: std::sync::atomic::AtomicUsize::new(0),
            // The port was free when the kit took it: no gateway yet.
            seen_down: std::sync::atomic::AtomicBool::new(true),
        }
    }

    /// How many gateways came up so far; notes whether none is up now.
    pub fn count(&self) -> usize {
        use std::sync::atomic::Ordering;
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], self.port));
        if std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            self.seen_down.store(true, Ordering::SeqCst);
        }
        self.count.load(Ordering::SeqCst)
    }

    /// Waits until `n` gateways came up in total: the one after the last
    /// seen down must answer `/health` with 200.
    ///
    /// # Panics
    /// When the listener was never seen down since the last arrival, or
    /// [`crate::wait::WAIT`] passes first.
    pub async fn wait(&self, n: usize) {
        use std::sync::atomic::Ordering;
        let count = self.count.load(Ordering::SeqCst);
        if n <= count {
            return;
        }
        assert_eq!(n, count + 1, "gateways only come up one at a time");
        assert!(
            self.seen_down.load(Ordering::SeqCst),
            "no gateway was seen down, so none can have come up since"
        );
        let http = reqwest::Client::new();
        let url = format!("http://127.0.0.1:{}/health", self.port);
        crate::wait::wait_for("the listener to take deliveries", || async {
            match http.get(&url).send().await {
                Ok(r) if r.status().as_u16() == 200 => Ok(()),
                Ok(r) => Err(format!("{}", r.status())),
                Err(e) => Err(e.to_string()),
            }
        })
        .await;
        self.seen_down.store(false, Ordering::SeqCst);
        self.count.store(n, Ordering::SeqCst);
    }
}

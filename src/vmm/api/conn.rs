//! One API client's connection and where it stands: reading its request
//! within a deadline, having it answered, waiting for a capture's profile,
//! writing the answer and lingering to read what the client still sends.
//! Generic over the byte stream ([`ConnStream`]) and what answers
//! ([`Service`]), and moved on only by the `now` its caller passes, so that
//! its tests drive it with scripted streams and a clock of their own.

use std::io::{self, Read, Write};
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use super::http::{Request, Response, parse_request};
use super::routes::{Answer, Origin};
use crate::guest_warn;
use crate::vmm::base::recorder::CaptureId;

/// How long a client may take to send its whole request, from the moment
/// it connected: a client that trickles bytes or sends none is closed then.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(5);
/// How long a client may take to take its answer.
pub const WRITE_DEADLINE: Duration = Duration::from_secs(5);
/// How long, and how many bytes, a connection is read after its answer
/// (see [`State::Lingering`]).
pub const LINGER: Duration = Duration::from_millis(500);
pub const LINGER_BYTES: usize = 1 << 20;

/// Requests refused (malformed, oversized, slow), for the rate-limited log
/// lines.
pub static REFUSED: AtomicU64 = AtomicU64::new(0);

/// A client's byte stream, non-blocking: reads and writes that cannot go on
/// now fail with `WouldBlock`.
pub trait ConnStream: Read + Write {
    /// Shuts our side's writing down: the answer is whole.
    fn finish_writing(&self) -> io::Result<()>;
}

/// What answers a connection's request.
pub trait Service {
    /// The most bytes a request's body takes.
    fn max_body(&self) -> usize;
    /// The answer to `request`, now or once a capture is due.
    fn route(&mut self, request: &Request, origin: Origin) -> Answer;
    /// The profile of capture `id`, once due.
    fn finish_profile(&self, id: CaptureId) -> Response;
    /// The client that waited for capture `id` went away.
    fn drop_capture(&self, id: CaptureId);
}

/// Which way a connection waits for its stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interest {
    /// Bytes to read (or the client's hang-up).
    Read,
    /// Room to write.
    Write,
}

/// One client's connection. Every state has a time limit, and every read
/// and write is non-blocking: one client never holds another.
pub struct Conn<S> {
    /// The client's stream.
    pub stream: S,
    /// Which listener it came on.
    pub origin: Origin,
    state: State,
    /// When the current state ends the connection (a capture's client
    /// waits for `due` instead).
    deadline: Instant,
}

enum State {
    /// Reading the request; what came so far.
    Reading(Vec<u8>),
    /// Waiting for the profile of a capture.
    Waiting {
        id: CaptureId,
        due: Instant,
        /// Bytes it sent after its request, ignored up to [`LINGER_BYTES`].
        extra: usize,
    },
    /// Writing the answer.
    Writing { out: Vec<u8>, at: usize },
    /// Our side closed; reading what the client still sends (a refused
    /// request's rest, a pipelined second request): closing with unread
    /// input would reset the connection, and the client could lose the
    /// answer.
    Lingering { left: usize },
}

/// What a non-blocking read or write came to.
enum Io {
    Done(usize),
    Later,
    Closed,
}

fn io_result(r: io::Result<usize>) -> Io {
    match r {
        Ok(0) => Io::Closed,
        Ok(n) => Io::Done(n),
        Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock) => Io::Later,
        Err(e) if matches!(e.kind(), io::ErrorKind::Interrupted) => Io::Done(0),
        Err(_) => Io::Closed,
    }
}

impl<S: ConnStream> Conn<S> {
    /// A connection accepted at `now`, reading its request.
    pub fn new(stream: S, origin: Origin, now: Instant) -> Self {
        Conn {
            stream,
            origin,
            state: State::Reading(Vec::new()),
            deadline: now + REQUEST_DEADLINE,
        }
    }

    /// What the connection waits for.
    pub fn interest(&self) -> Interest {
        match self.state {
            State::Writing { .. } => Interest::Write,
            _ => Interest::Read,
        }
    }

    /// When [`Self::tick`] has something to do at the latest.
    pub fn wake_at(&self) -> Instant {
        match self.state {
            State::Waiting { due, .. } => due,
            _ => self.deadline,
        }
    }

    /// Answers with `response` from `now` on.
    pub fn respond(&mut self, response: Response, now: Instant) {
        self.state = State::Writing {
            out: response.to_bytes(),
            at: 0,
        };
        self.deadline = now + WRITE_DEADLINE;
    }

    /// Moves on with time; false when the connection is done.
    pub fn tick(&mut self, now: Instant, service: &impl Service) -> bool {
        match self.state {
            State::Waiting { id, due, .. } => {
                if now >= due {
                    self.respond(service.finish_profile(id), now);
                }
                true
            }
            State::Reading(_) if now >= self.deadline => {
                guest_warn!(
                    REFUSED,
                    "API: closed a client that did not send its request within {REQUEST_DEADLINE:?}"
                );
                false
            }
            _ => now < self.deadline,
        }
    }

    /// The VM ended: a capture's client gets its profile, a request not
    /// yet read is dropped; false when the connection is done.
    pub fn finish(&mut self, now: Instant, service: &impl Service) -> bool {
        match self.state {
            State::Waiting { id, .. } => {
                self.respond(service.finish_profile(id), now);
                true
            }
            State::Reading(_) => false,
            _ => true,
        }
    }

    /// Moves on with what the stream is ready for; false when the
    /// connection is done.
    pub fn ready(&mut self, now: Instant, service: &mut impl Service) -> bool {
        match &mut self.state {
            State::Reading(buf) => {
                let mut chunk = [0u8; 4096];
                loop {
                    match io_result(self.stream.read(&mut chunk)) {
                        Io::Closed => return false,
                        Io::Later => return true,
                        Io::Done(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                    match parse_request(buf, service.max_body()) {
                        Ok(None) => {}
                        Ok(Some(request)) => {
                            match service.route(&request, self.origin) {
                                Answer::Now(r) => self.respond(r, now),
                                Answer::Profile { id, due } => {
                                    self.state = State::Waiting { id, due, extra: 0 };
                                }
                            }
                            return true;
                        }
                        Err(e) => {
                            let Some(status) = e.status() else {
                                return false;
                            };
                            guest_warn!(REFUSED, "API: refused a request: {e}");
                            self.respond(Response::fault(status, &e.to_string()), now);
                            return true;
                        }
                    }
                }
            }
            State::Waiting { id, extra, .. } => {
                let mut sink = [0u8; 512];
                // A client that hangs up takes its capture with it; one
                // that keeps sending while it waits is let go: it would
                // keep the API reading.
                let gone = match io_result(self.stream.read(&mut sink)) {
                    Io::Closed => true,
                    Io::Later => false,
                    Io::Done(n) => {
                        *extra += n;
                        *extra > LINGER_BYTES
                    }
                };
                if gone {
                    service.drop_capture(*id);
                }
                !gone
            }
            State::Writing { out, at } => {
                while *at < out.len() {
                    match io_result(self.stream.write(&out[*at..])) {
                        Io::Closed => return false,
                        Io::Later => return true,
                        Io::Done(n) => *at += n,
                    }
                }
                if self.stream.finish_writing().is_err() {
                    return false;
                }
                self.state = State::Lingering { left: LINGER_BYTES };
                self.deadline = now + LINGER;
                true
            }
            State::Lingering { left } => {
                let mut sink = [0u8; 4096];
                loop {
                    match io_result(self.stream.read(&mut sink)) {
                        Io::Closed => return false,
                        Io::Later => return true,
                        Io::Done(n) => {
                            *left = left.saturating_sub(n);
                            if *left == 0 {
                                return false;
                            }
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::{Cell, RefCell};
    use std::collections::VecDeque;

    /// What a scripted client does at each read of ours.
    #[derive(Debug, Clone)]
    enum Step {
        /// Its next bytes.
        Send(Vec<u8>),
        /// Nothing yet (`WouldBlock`).
        Pause,
        /// It shut its writing down (a half-close) or hung up: reads give 0.
        Close,
    }

    #[derive(Default)]
    struct Client {
        script: VecDeque<Step>,
        /// What we wrote to it.
        got: Vec<u8>,
        /// How many bytes of ours it takes in all; past it writes block.
        takes: Option<usize>,
        /// Whether our side shut its writing down (the answer whole).
        finished: Cell<bool>,
        closed: bool,
    }

    impl Client {
        fn of(script: &[Step]) -> Self {
            Client {
                script: script.iter().cloned().collect(),
                ..Client::default()
            }
        }
    }

    impl Read for Client {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            if self.closed {
                return Ok(0);
            }
            match self.script.pop_front() {
                Some(Step::Send(mut bytes)) => {
                    let n = bytes.len().min(buf.len());
                    buf[..n].copy_from_slice(&bytes[..n]);
                    if n < bytes.len() {
                        self.script.push_front(Step::Send(bytes.split_off(n)));
                    }
                    Ok(n)
                }
                Some(Step::Close) => {
                    self.closed = true;
                    Ok(0)
                }
                Some(Step::Pause) | None => Err(io::ErrorKind::WouldBlock.into()),
            }
        }
    }

    impl Write for Client {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let room = self
                .takes
                .map_or(buf.len(), |t| t.saturating_sub(self.got.len()));
            if room == 0 {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            let n = room.min(buf.len());
            self.got.extend_from_slice(&buf[..n]);
            Ok(n)
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl ConnStream for Client {
        fn finish_writing(&self) -> io::Result<()> {
            self.finished.set(true);
            Ok(())
        }
    }

    /// Answers every request 200 with its path, or with capture 7 due in a
    /// second for `/capture`; records what it was asked.
    #[derive(Default)]
    struct Fake {
        routed: Vec<String>,
        dropped: RefCell<Vec<CaptureId>>,
    }

    impl Service for Fake {
        fn max_body(&self) -> usize {
            64
        }

        fn route(&mut self, request: &Request, _: Origin) -> Answer {
            self.routed.push(request.path.clone());
            if request.path == "/capture" {
                return Answer::Profile {
                    id: 7,
                    due: start() + Duration::from_secs(1),
                };
            }
            Answer::Now(Response::ok(
                "text/plain",
                request.path.clone().into_bytes(),
            ))
        }

        fn finish_profile(&self, id: CaptureId) -> Response {
            Response::ok("text/plain", format!("profile {id}").into_bytes())
        }

        fn drop_capture(&self, id: CaptureId) {
            self.dropped.borrow_mut().push(id);
        }
    }

    thread_local! {
        static START: Instant = Instant::now();
    }

    /// The made-up clock's zero.
    fn start() -> Instant {
        START.with(|s| *s)
    }

    fn at(ms: u64) -> Instant {
        start() + Duration::from_millis(ms)
    }

    fn get(path: &str) -> Vec<u8> {
        format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").into_bytes()
    }

    /// What happens at one moment: the stream is ready, or time passes, or
    /// the VM ends.
    #[derive(Debug, Clone, Copy)]
    enum Event {
        Ready(u64),
        Tick(u64),
        Finish(u64),
    }

    /// The connection's life under `events`: whether it is still open after
    /// each, and what the client got.
    fn run(client: Client, events: &[Event]) -> (Vec<bool>, String, Fake, bool) {
        let mut service = Fake::default();
        let mut conn = Conn::new(client, Origin::Unix, start());
        let mut open = Vec::new();
        for e in events {
            let still = match *e {
                Event::Ready(ms) => conn.ready(at(ms), &mut service),
                Event::Tick(ms) => conn.tick(at(ms), &service),
                Event::Finish(ms) => conn.finish(at(ms), &service),
            };
            open.push(still);
            if !still {
                break;
            }
        }
        let got = String::from_utf8_lossy(&conn.stream.got).into_owned();
        (open, got, service, conn.stream.finished.get())
    }

    #[test]
    fn clients_fast_slow_idle_pipelined_oversized_and_half_closed() {
        use Event::*;
        use Step::*;
        let mut head = get("/a");
        let tail = head.split_off(10);
        let oversized = b"PUT /a HTTP/1.1\r\nContent-Length: 65\r\n\r\n".to_vec();
        let mut two = get("/first");
        two.extend(get("/second"));
        // (what, the client's script, events, open after each, in the
        // answer, paths routed)
        type Case = (
            &'static str,
            Vec<Step>,
            Vec<Event>,
            Vec<bool>,
            &'static str,
            Vec<&'static str>,
        );
        let table: Vec<Case> = vec![
            (
                "a request, answered, then the client hangs up",
                vec![Send(get("/a")), Close],
                vec![Ready(0), Ready(1), Ready(2)],
                vec![true, true, false],
                "200 OK",
                vec!["/a"],
            ),
            (
                "a slow client: half a request, then the deadline",
                vec![Send(head.clone()), Pause, Pause],
                vec![Ready(0), Tick(4_999), Ready(4_999), Tick(5_000)],
                vec![true, true, true, false],
                "",
                vec![],
            ),
            (
                "a slow client whose rest comes in time",
                vec![Send(head), Pause, Send(tail)],
                vec![Ready(0), Ready(4_000), Ready(4_999)],
                vec![true, true, true],
                "200 OK",
                vec!["/a"],
            ),
            (
                "an idle client, closed at the deadline",
                vec![],
                vec![Tick(1_000), Ready(1_000), Tick(5_000)],
                vec![true, true, false],
                "",
                vec![],
            ),
            (
                "two pipelined requests: the first answered, the second read and dropped",
                vec![Send(two), Pause, Close],
                vec![Ready(0), Ready(1), Ready(2), Ready(3)],
                vec![true, true, true, false],
                "/first",
                vec!["/first"],
            ),
            (
                "an oversized body: 413 before it is read",
                vec![Send(oversized), Pause],
                vec![Ready(0), Ready(1)],
                vec![true, true],
                "413",
                vec![],
            ),
            (
                "half-closed after its request: still answered",
                vec![Send(get("/a")), Close],
                vec![Ready(0), Ready(1), Ready(2)],
                vec![true, true, false],
                "200 OK",
                vec!["/a"],
            ),
            (
                "half-closed before its request ends: no answer",
                vec![Send(b"GET /a HT".to_vec()), Close],
                vec![Ready(0)],
                vec![false],
                "",
                vec![],
            ),
            (
                "garbage: 400",
                vec![Send(b"\x00\x01 nonsense\r\n\r\n".to_vec()), Pause],
                vec![Ready(0), Ready(1)],
                vec![true, true],
                "400",
                vec![],
            ),
            (
                "a capture's client waits for its profile",
                vec![Send(get("/capture")), Pause],
                vec![Ready(0), Tick(999), Tick(1_000), Ready(1_001)],
                vec![true, true, true, true],
                "profile 7",
                vec!["/capture"],
            ),
            (
                "a capture's client gets its profile when the VM ends",
                vec![Send(get("/capture")), Pause],
                vec![Ready(0), Finish(10), Ready(11)],
                vec![true, true, true],
                "profile 7",
                vec!["/capture"],
            ),
            (
                "a request not yet whole when the VM ends is dropped",
                vec![Send(b"GET /a".to_vec()), Pause],
                vec![Ready(0), Finish(10)],
                vec![true, false],
                "",
                vec![],
            ),
            (
                "lingering ends after its time",
                vec![Send(get("/a")), Pause, Pause],
                vec![Ready(0), Ready(1), Tick(500), Tick(501)],
                vec![true, true, true, false],
                "200 OK",
                vec!["/a"],
            ),
        ];
        for (what, script, events, open, answer, routed) in table {
            let (got_open, got, service, finished) = run(Client::of(&script), &events);
            assert_eq!(got_open, open, "{what}");
            assert!(got.contains(answer), "{what}: {got:?}");
            // An answer goes out whole, and then our side of it ends.
            assert_eq!(finished, !answer.is_empty(), "{what}");
            if answer.is_empty() {
                assert!(got.is_empty(), "{what}: {got:?}");
            }
            assert_eq!(service.routed, routed, "{what}");
        }
    }

    #[test]
    fn a_client_that_does_not_take_its_answer_is_closed_and_one_that_leaves_drops_its_capture() {
        let slow_reader = Client {
            takes: Some(10),
            ..Client::of(&[Step::Send(get("/a"))])
        };
        let (open, got, _, finished) = run(
            slow_reader,
            &[
                Event::Ready(0),
                Event::Ready(1),
                Event::Tick(4_999),
                Event::Tick(5_000),
            ],
        );
        assert_eq!(open, [true, true, true, false]);
        assert_eq!(got.len(), 10, "only what it took: {got:?}");
        assert!(!finished);
        let leaver = Client::of(&[Step::Send(get("/capture")), Step::Close]);
        let (open, got, service, _) = run(leaver, &[Event::Ready(0), Event::Ready(1)]);
        assert_eq!(open, [true, false]);
        assert!(got.is_empty());
        assert_eq!(*service.dropped.borrow(), [7]);
    }
}

//! The HTTP/1.1 of the control API: one request per connection, parsed
//! as its bytes arrive within fixed bounds (httparse parses the head), and
//! a response that closes the connection. Clients are untrusted: every malformed, oversized
//! or truncated request is a typed error, never a panic.

use std::io::{Read, Write};

use serde::Serialize;
use thiserror::Error;

/// The most bytes a request's head (request line and header fields) takes.
pub const MAX_HEAD: usize = 8192;
/// The most bytes a request's body takes, unless the API is told
/// otherwise ([`super::ApiListeners::max_body`]).
pub const MAX_BODY: usize = 16384;
/// The most bytes a request's body may be allowed to take: bodies are held
/// whole, up to this much for each of the connections open at once.
pub const MAX_BODY_LIMIT: usize = 1 << 20;
/// The most header fields a request has.
const MAX_HEADERS: usize = 32;

/// Why a request could not be read.
#[derive(Debug, Error)]
pub enum HttpError {
    /// The head outgrew [`MAX_HEAD`].
    #[error("the request head is larger than {MAX_HEAD} bytes")]
    HeadTooLarge,
    /// Content-Length is past the API's limit.
    #[error("the request body ({len} bytes) is larger than {max} bytes")]
    BodyTooLarge {
        /// What Content-Length says.
        len: u64,
        /// The most bytes a body takes here.
        max: usize,
    },
    /// Not HTTP/1.x as this server takes it.
    #[error("malformed request: {0}")]
    Malformed(String),
    /// The client went away before its request was complete.
    #[error("the client closed the connection before its request ended")]
    Closed,
    /// Reading failed (a timeout among others).
    #[error("reading the request: {0}")]
    Io(#[from] std::io::Error),
}

impl HttpError {
    /// The status to answer with; `None` where nobody is left to answer.
    pub fn status(&self) -> Option<u16> {
        match self {
            HttpError::HeadTooLarge => Some(431),
            HttpError::BodyTooLarge { .. } => Some(413),
            HttpError::Malformed(_) => Some(400),
            HttpError::Closed | HttpError::Io(_) => None,
        }
    }
}

/// A request as the routes see it.
#[derive(Debug, PartialEq, Eq)]
pub struct Request {
    /// GET, PUT, PATCH, ...
    pub method: String,
    /// The path without its query.
    pub path: String,
    /// What follows `?`, if anything.
    pub query: Option<String>,
    /// The body (Content-Length bytes).
    pub body: Vec<u8>,
}

/// Reads one request from `from`, its body at most [`MAX_BODY`] bytes,
/// blocking (for tests and simple clients; the server feeds
/// [`parse_request`] as bytes arrive).
pub fn read_request(from: &mut impl Read) -> Result<Request, HttpError> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        let n = from.read(&mut chunk)?;
        if n == 0 {
            return Err(HttpError::Closed);
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(request) = parse_request(&buf, MAX_BODY)? {
            return Ok(request);
        }
    }
}

/// The request `buf` holds, once all of it has arrived (`None` until
/// then), its body at most `max_body` bytes. What follows its body is
/// ignored.
pub fn parse_request(buf: &[u8], max_body: usize) -> Result<Option<Request>, HttpError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut head = httparse::Request::new(&mut headers);
    match head.parse(buf) {
        Ok(httparse::Status::Complete(len)) if len > MAX_HEAD => Err(HttpError::HeadTooLarge),
        Ok(httparse::Status::Complete(len)) => {
            let (mut request, body_len) = parts(&head, max_body)?;
            // Bounded by `max_body` in `parts`.
            let body_len = usize::try_from(body_len).unwrap_or(max_body);
            match buf.get(len..len + body_len) {
                Some(body) => {
                    request.body = body.to_vec();
                    Ok(Some(request))
                }
                None => Ok(None),
            }
        }
        Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD => Err(HttpError::HeadTooLarge),
        Ok(httparse::Status::Partial) => Ok(None),
        Err(httparse::Error::TooManyHeaders) => Err(HttpError::Malformed(format!(
            "more than {MAX_HEADERS} header fields"
        ))),
        Err(e) => Err(HttpError::Malformed(e.to_string())),
    }
}

/// The request line's parts and the body's length.
fn parts(head: &httparse::Request<'_, '_>, max_body: usize) -> Result<(Request, u64), HttpError> {
    let (Some(method), Some(target)) = (head.method, head.path) else {
        return Err(HttpError::Malformed("no request line".into()));
    };
    let mut body_len = 0;
    for h in head.headers.iter() {
        if h.name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(HttpError::Malformed(
                "chunked bodies are not taken: send Content-Length".into(),
            ));
        }
        if h.name.eq_ignore_ascii_case("content-length") {
            body_len = std::str::from_utf8(h.value)
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .ok_or_else(|| HttpError::Malformed("Content-Length is not a number".into()))?;
        }
    }
    if body_len > max_body as u64 {
        return Err(HttpError::BodyTooLarge {
            len: body_len,
            max: max_body,
        });
    }
    let (path, query) = match target.split_once('?') {
        Some((path, query)) => (path, Some(query.to_owned())),
        None => (target, None),
    };
    let request = Request {
        method: method.to_owned(),
        path: path.to_owned(),
        query,
        body: Vec::new(),
    };
    Ok((request, body_len))
}

/// A response; the connection closes after it.
#[derive(Debug, PartialEq, Eq)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// The body's media type (none for an empty body).
    pub content_type: &'static str,
    /// The body.
    pub body: Vec<u8>,
    /// For 405: the methods the path takes.
    pub allow: Option<&'static str>,
    /// The answer to a HEAD request: the head alone (Content-Length still
    /// says what GET's body would be).
    pub head_only: bool,
}

/// A fault's body, as Firecracker's API writes it.
#[derive(Serialize)]
struct Fault<'a> {
    fault_message: &'a str,
}

impl Response {
    /// `status` with `value` as JSON.
    pub fn json(status: u16, value: &impl Serialize) -> Self {
        match serde_json::to_vec_pretty(value) {
            Ok(mut body) => {
                body.push(b'\n');
                Response {
                    status,
                    content_type: "application/json",
                    body,
                    allow: None,
                    head_only: false,
                }
            }
            Err(e) => Response::fault(500, &format!("cannot encode the answer: {e}")),
        }
    }

    /// An error `status` saying `message`.
    pub fn fault(status: u16, message: &str) -> Self {
        let body = serde_json::to_vec(&Fault {
            fault_message: message,
        })
        .unwrap_or_default();
        Response {
            status,
            content_type: "application/json",
            body,
            allow: None,
            head_only: false,
        }
    }

    /// 204: done, nothing to say.
    pub fn no_content() -> Self {
        Response {
            status: 204,
            content_type: "",
            body: Vec::new(),
            allow: None,
            head_only: false,
        }
    }

    /// 200 with a body of `content_type`.
    pub fn ok(content_type: &'static str, body: Vec<u8>) -> Self {
        Response {
            status: 200,
            content_type,
            body,
            allow: None,
            head_only: false,
        }
    }

    /// Writes it.
    pub fn write(&self, to: &mut impl Write) -> std::io::Result<()> {
        to.write_all(&self.to_bytes())?;
        to.flush()
    }

    /// Its bytes on the wire.
    pub fn to_bytes(&self) -> Vec<u8> {
        // lwpvmm's own version rides in Server: Firecracker's GET /version
        // and GET / carry the version of Firecracker's API it follows.
        let mut head = format!(
            "HTTP/1.1 {} {}\r\nServer: lwpvmm/{}\r\nConnection: close\r\nContent-Length: {}\r\n",
            self.status,
            reason(self.status),
            env!("CARGO_PKG_VERSION"),
            self.body.len()
        );
        if !self.content_type.is_empty() {
            head.push_str(&format!("Content-Type: {}\r\n", self.content_type));
        }
        if let Some(allow) = self.allow {
            head.push_str(&format!("Allow: {allow}\r\n"));
        }
        head.push_str("\r\n");
        let mut out = head.into_bytes();
        if !self.head_only {
            out.extend_from_slice(&self.body);
        }
        out
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        204 => "No Content",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        409 => "Conflict",
        413 => "Content Too Large",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "Internal Server Error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads from a byte string, a few bytes per call, as a socket may.
    struct Trickle<'a>(&'a [u8]);

    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = self.0.len().min(buf.len()).min(7);
            buf[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }

    fn read(bytes: &[u8]) -> Result<Request, HttpError> {
        read_request(&mut Trickle(bytes))
    }

    #[test]
    fn requests_read_and_refused() {
        let big_head = format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(MAX_HEAD));
        let many = format!("GET / HTTP/1.1\r\n{}\r\n", "X: y\r\n".repeat(40));
        // (bytes, the status of the refusal, or None for a request read)
        let table: Vec<(&[u8], Option<Option<u16>>)> = vec![
            (b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", None),
            (
                b"PUT /snapshot/create HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}",
                None,
            ),
            (b"GET / HTTP/1.1\r\nHost: x\r\n", Some(None)),
            (b"PUT / HTTP/1.1\r\nContent-Length: 9\r\n\r\n{}", Some(None)),
            (b"GARBAGE\r\n\r\n", Some(Some(400))),
            (
                b"PUT / HTTP/1.1\r\nContent-Length: lots\r\n\r\n",
                Some(Some(400)),
            ),
            (
                b"PUT / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
                Some(Some(400)),
            ),
            (
                b"PUT / HTTP/1.1\r\nContent-Length: 99999999999\r\n\r\n",
                Some(Some(413)),
            ),
            (big_head.as_bytes(), Some(Some(431))),
            (many.as_bytes(), Some(Some(400))),
        ];
        for (bytes, refused) in table {
            let got = read(bytes);
            match refused {
                None => assert!(got.is_ok(), "{got:?}"),
                Some(status) => {
                    assert_eq!(
                        got.as_ref().err().and_then(HttpError::status),
                        status,
                        "{got:?}"
                    )
                }
            }
        }
    }

    #[test]
    fn the_body_limit_is_the_one_given() {
        // (Content-Length, the limit, whether the request is taken)
        let table = [
            (16384, MAX_BODY, true),
            (16385, MAX_BODY, false),
            // Firecracker's default --http-api-max-payload-size.
            (51200, 51200, true),
            (51201, 51200, false),
            (1, 0, false),
        ];
        for (len, max, taken) in table {
            let mut bytes =
                format!("PUT /drives/a HTTP/1.1\r\nContent-Length: {len}\r\n\r\n").into_bytes();
            bytes.resize(bytes.len() + len, b' ');
            match parse_request(&bytes, max) {
                Ok(Some(r)) => assert!(taken && r.body.len() == len, "{len} of {max}"),
                Err(e) => {
                    assert!(!taken, "{len} of {max}: {e}");
                    assert_eq!(e.status(), Some(413));
                    assert!(e.to_string().contains(&format!("larger than {max} bytes")));
                }
                Ok(None) => panic!("{len} of {max}: the whole request is there"),
            }
        }
    }

    #[test]
    fn the_server_header_names_lwpvmms_version() {
        let wire = String::from_utf8(Response::no_content().to_bytes()).unwrap();
        assert!(
            wire.contains(&format!(
                "\r\nServer: lwpvmm/{}\r\n",
                env!("CARGO_PKG_VERSION")
            )),
            "{wire}"
        );
    }

    #[test]
    fn a_request_keeps_its_query_and_exactly_its_body() {
        let got = read(b"PATCH /vm?x=1 HTTP/1.1\r\nContent-Length: 4\r\n\r\nabcdEXTRA").unwrap();
        assert_eq!(
            got,
            Request {
                method: "PATCH".into(),
                path: "/vm".into(),
                query: Some("x=1".into()),
                body: b"abcd".to_vec(),
            }
        );
    }

    #[test]
    fn responses_carry_length_type_and_allow() {
        let mut out = Vec::new();
        let mut r = Response::fault(405, "no");
        r.allow = Some("GET");
        r.write(&mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.starts_with("HTTP/1.1 405 Method Not Allowed\r\n"),
            "{text}"
        );
        assert!(text.contains("Content-Length: 22\r\n"), "{text}");
        assert!(text.contains("Allow: GET\r\n"), "{text}");
        assert!(
            text.ends_with("\r\n\r\n{\"fault_message\":\"no\"}"),
            "{text}"
        );
    }
}

//! A small Chrome DevTools Protocol client for the browser tests: starts Debian's `chromium`
//! headless on a fresh profile, connects to its first page's websocket (a minimal RFC 6455
//! client: text frames, masked as a client must, fragments joined) and sends commands,
//! keeping the events that arrive meanwhile for `document_loaded`.

use std::collections::VecDeque;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use base64::Engine;
use rand::RngCore;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

/// Longest wait for the browser to start, a command's answer or an event.
const WAIT_MAX: Duration = Duration::from_secs(30);
/// A message larger than this is refused (a full-page screenshot is a few MB of base64).
const MESSAGE_BYTES_MAX: u64 = 64 * 1024 * 1024;
/// Events kept while waiting for a command's answer.
const EVENTS_KEPT_MAX: usize = 10_000;

pub struct Browser {
    child: Child,
    socket: TcpStream,
    next_id: u64,
    events: VecDeque<Value>,
    _profile: tempfile::TempDir,
}

impl Browser {
    pub async fn launch() -> Self {
        let profile = tempfile::tempdir().unwrap();
        let mut child = Command::new("chromium")
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--remote-debugging-port=0",
                "--no-first-run",
                "--window-size=1280,1400",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("chromium is installed (apt-get install chromium; .ci/run does it)");
        let mut stderr = BufReader::new(child.stderr.take().unwrap()).lines();
        let browser_url = tokio::time::timeout(WAIT_MAX, async {
            while let Some(line) = stderr.next_line().await.unwrap() {
                if let Some(url) = line.strip_prefix("DevTools listening on ") {
                    return url.trim().to_owned();
                }
            }
            panic!("chromium exited without a DevTools address");
        })
        .await
        .expect("chromium starts");
        // Keep reading stderr so the browser never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = stderr.next_line().await {} });
        let port = browser_url.trim_start_matches("ws://").split(['/', ':']).nth(1).unwrap().to_owned();
        let targets: Value = reqwest::get(format!("http://127.0.0.1:{port}/json/list")).await.unwrap().json().await.unwrap();
        let page = targets.as_array().unwrap().iter().find(|target| target["type"] == "page").expect("a page target");
        let page_url = page["webSocketDebuggerUrl"].as_str().unwrap().to_owned();
        let socket = connect(&page_url).await;
        let mut browser = Self { child, socket, next_id: 0, events: VecDeque::new(), _profile: profile };
        browser.call("Page.enable", json!({})).await;
        browser.call("Network.enable", json!({})).await;
        browser
    }

    /// Sends a command and returns its result; a protocol error fails the test.
    pub async fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let message = json!({"id": id, "method": method, "params": params}).to_string();
        send_text(&mut self.socket, message.as_bytes()).await;
        tokio::time::timeout(WAIT_MAX, async {
            loop {
                let message = self.receive().await;
                if message["id"] == id {
                    if let Some(error) = message.get("error") {
                        panic!("{method} failed: {error}");
                    }
                    return message["result"].clone();
                }
                if message.get("method").is_some() && self.events.len() < EVENTS_KEPT_MAX {
                    self.events.push_back(message);
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{method} answered in time"))
    }

    async fn receive(&mut self) -> Value {
        let bytes = receive_message(&mut self.socket).await;
        serde_json::from_slice(&bytes).unwrap()
    }

    /// Opens `url` and waits for the page to load; the HTTP status of the document it ended on.
    pub async fn navigate(&mut self, url: &str) -> u64 {
        self.events.clear();
        self.call("Page.navigate", json!({"url": url})).await;
        self.document_loaded().await
    }

    /// Waits for a page load; the last document response's status.
    async fn document_loaded(&mut self) -> u64 {
        let mut status = 0;
        tokio::time::timeout(WAIT_MAX, async {
            loop {
                let event = match self.events.pop_front() {
                    Some(event) => event,
                    None => self.receive().await,
                };
                match event["method"].as_str() {
                    Some("Network.responseReceived") if event["params"]["type"] == "Document" => {
                        status = event["params"]["response"]["status"].as_u64().unwrap();
                    }
                    Some("Page.loadEventFired") => return,
                    _ => {}
                }
            }
        })
        .await
        .expect("the page loads in time");
        status
    }

    /// Fills the period picker and submits it as a person would; waits for the new page.
    pub async fn submit_period(&mut self, from: &str, to: &str, search: &str) {
        self.events.clear();
        let script = format!(
            "(() => {{ const form = document.getElementById('period');
               form.elements.from.value = {}; form.elements.to.value = {}; form.elements.q.value = {};
               form.requestSubmit(); return 'submitted'; }})()",
            json!(from),
            json!(to),
            json!(search)
        );
        assert_eq!(self.eval_string(&script).await, "submitted");
        let status = self.document_loaded().await;
        assert_eq!(status, 200, "the period picker's page loads");
    }

    /// Evaluates an expression that yields a string.
    pub async fn eval_string(&mut self, expression: &str) -> String {
        let result = self.call("Runtime.evaluate", json!({"expression": expression, "returnByValue": true})).await;
        if let Some(exception) = result.get("exceptionDetails") {
            panic!("{expression} threw: {exception}");
        }
        result["result"]["value"].as_str().unwrap_or_else(|| panic!("{expression} is a string: {result}")).to_owned()
    }

    /// The text of the first element matching `selector` ("" when none).
    pub async fn text(&mut self, selector: &str) -> String {
        self.eval_string(&format!("(document.querySelector({}) || {{textContent: ''}}).textContent", json!(selector))).await
    }

    /// A table's rows, one line each, cells separated by tabs ("" when there is no table).
    pub async fn table_text(&mut self, selector: &str) -> String {
        self.eval_string(&format!(
            "Array.from(document.querySelectorAll({} + ' tr')).map(row => Array.from(row.cells).map(cell => cell.textContent).join('\\t')).join('\\n')",
            json!(selector)
        ))
        .await
    }

    /// The finance session cookie, as a `Cookie` header value (the page's script cannot see
    /// it: HttpOnly).
    pub async fn session_cookie(&mut self) -> String {
        let cookies = self.call("Network.getCookies", json!({})).await;
        let cookie = cookies["cookies"]
            .as_array()
            .unwrap()
            .iter()
            .find(|cookie| cookie["name"] == chargeguard::finance::SESSION_COOKIE)
            .expect("the session cookie is set");
        assert_eq!(cookie["httpOnly"], true);
        assert_eq!(cookie["sameSite"], "Strict");
        assert_eq!(self.eval_string("document.cookie").await, "", "scripts cannot read the session");
        format!("{}={}", cookie["name"].as_str().unwrap(), cookie["value"].as_str().unwrap())
    }

    /// Writes a PNG of the whole page to `path`.
    pub async fn screenshot(&mut self, path: &Path) {
        let shot = self.call("Page.captureScreenshot", json!({"format": "png", "captureBeyondViewport": true})).await;
        let png = base64::engine::general_purpose::STANDARD.decode(shot["data"].as_str().unwrap()).unwrap();
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, png).unwrap();
    }

    pub async fn close(mut self) {
        let _ = self.child.start_kill();
        let _ = tokio::time::timeout(WAIT_MAX, self.child.wait()).await;
    }
}

/// Opens a websocket to `url` (`ws://host:port/path`).
async fn connect(url: &str) -> TcpStream {
    let rest = url.strip_prefix("ws://").expect("a ws:// URL");
    let (authority, path) = rest.split_once('/').unwrap();
    let mut socket = TcpStream::connect(authority).await.unwrap();
    let mut key = [0u8; 16];
    rand::thread_rng().fill_bytes(&mut key);
    let key = base64::engine::general_purpose::STANDARD.encode(key);
    let request = format!(
        "GET /{path} HTTP/1.1\r\nHost: {authority}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
    );
    socket.write_all(request.as_bytes()).await.unwrap();
    // Byte by byte up to the blank line, so no frame byte is read with the headers.
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        assert!(head.len() < 16 * 1024, "an upgrade answer of bounded size");
        head.push(socket.read_u8().await.unwrap());
    }
    let head = String::from_utf8_lossy(&head);
    assert!(head.starts_with("HTTP/1.1 101"), "websocket upgrade refused: {head}");
    socket
}

async fn send_text(socket: &mut TcpStream, payload: &[u8]) {
    let mut frame = vec![0x81u8];
    match payload.len() {
        length if length < 126 => frame.push(0x80 | length as u8),
        length if length <= usize::from(u16::MAX) => {
            frame.push(0x80 | 126);
            frame.extend_from_slice(&(length as u16).to_be_bytes());
        }
        length => {
            frame.push(0x80 | 127);
            frame.extend_from_slice(&(length as u64).to_be_bytes());
        }
    }
    let mut mask = [0u8; 4];
    rand::thread_rng().fill_bytes(&mut mask);
    frame.extend_from_slice(&mask);
    frame.extend(payload.iter().enumerate().map(|(index, byte)| byte ^ mask[index % 4]));
    socket.write_all(&frame).await.unwrap();
}

/// The next whole text message (fragments joined); pings are answered.
async fn receive_message(socket: &mut TcpStream) -> Vec<u8> {
    let mut message = Vec::new();
    loop {
        let first = socket.read_u8().await.unwrap();
        let second = socket.read_u8().await.unwrap();
        let length = match second & 0x7f {
            126 => u64::from(socket.read_u16().await.unwrap()),
            127 => socket.read_u64().await.unwrap(),
            length => u64::from(length),
        };
        assert!(second & 0x80 == 0, "a server never masks");
        assert!(message.len() as u64 + length <= MESSAGE_BYTES_MAX, "a message of bounded size");
        let mut payload = vec![0u8; length as usize];
        socket.read_exact(&mut payload).await.unwrap();
        match first & 0x0f {
            0x9 => {
                let mut pong = vec![0x8a, 0x80 | payload.len() as u8, 0, 0, 0, 0];
                pong.extend_from_slice(&payload);
                socket.write_all(&pong).await.unwrap();
                continue;
            }
            0x8 => panic!("the browser closed the DevTools connection"),
            _ => message.extend_from_slice(&payload),
        }
        if first & 0x80 != 0 {
            return message;
        }
    }
}

//! A TCP proxy in front of the core that can hold the request bytes of a POST
//! for a while before passing them on: the network (a balancer, a proxy, the
//! kernel's buffers of a killed hub) delivering a request late. Bytes it has
//! read are delivered even after the hub's side of the connection is gone.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The proxy; it runs until the test ends.
pub struct HoldingProxy {
    pub addr: SocketAddr,
    hold: Arc<Mutex<Option<Duration>>>,
}

impl HoldingProxy {
    pub async fn start(upstream: SocketAddr) -> HoldingProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy addr");
        let hold: Arc<Mutex<Option<Duration>>> = Arc::default();
        let h = hold.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(pipe(client, upstream, h.clone()));
            }
        });
        HoldingProxy { addr, hold }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// From now on, a chunk of request bytes that starts a POST is held this
    /// long (None: passed on at once).
    pub fn hold_posts(&self, hold: Option<Duration>) {
        *self.hold.lock().unwrap() = hold;
    }
}

async fn pipe(client: TcpStream, upstream: SocketAddr, hold: Arc<Mutex<Option<Duration>>>) {
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let up = async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = match cr.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let held = *hold.lock().unwrap();
            if let Some(d) = held.filter(|_| buf[..n].starts_with(b"POST ")) {
                // The network holding the request; later bytes queue behind it.
                tokio::time::sleep(d).await;
            }
            if sw.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        // The hub's side is gone; the core still gets what was read, and its
        // answer has nowhere to go. Keep the core's side open until it closes.
        sw
    };
    let down = async move {
        let _ = tokio::io::copy(&mut sr, &mut cw).await;
    };
    tokio::spawn(async move {
        let _sw = up.await;
        // Hold the write half until the core is done with the connection.
        tokio::time::sleep(Duration::from_secs(30)).await;
    });
    down.await;
}

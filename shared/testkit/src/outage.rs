//! An outage of a shared service for one test only: a TCP relay in front of it.
//!
//! The MariaDB and RabbitMQ of `infra/local` serve every test running at the same time, so a
//! test must never stop them. A process pointed at a [`Relay`] instead sees the service
//! exactly as the relay lets it: [`Relay::cut`] stops listening on the relay's port and
//! drops every connection it carried (the client reads a closed socket, its next connect is
//! refused: what a stopped server looks like from the client's side), and
//! [`Relay::restore`] listens on the same port again, as a restarted server would.
//! [`Relay::stall`] is the other way a node goes away: every connection stays open and nothing
//! more crosses it (a partition, a hung host), which a client notices only by its own timeouts.

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
};

use tokio::{
    net::{TcpListener, TcpStream},
    sync::watch,
    task::{JoinHandle, JoinSet},
};
use url::Url;

/// A loopback TCP relay to one service, which a test can cut and restore.
pub struct Relay {
    address: SocketAddr,
    target: SocketAddr,
    running: Mutex<Option<JoinHandle<()>>>,
    stalled: watch::Sender<bool>,
}

impl Relay {
    /// A relay to the host and port of `url` (e.g. the test's database URL).
    pub async fn to(url: &Url) -> Arc<Self> {
        let host = url.host_str().expect("the URL names a host");
        let port = url.port_or_known_default().expect("the URL has a port");
        let target = tokio::net::lookup_host((host, port))
            .await
            .expect("resolve the service")
            .next()
            .expect("the service has an address");
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the relay");
        let relay = Arc::new(Self {
            address: listener.local_addr().expect("the relay's address"),
            target,
            running: Mutex::new(None),
            stalled: watch::channel(false).0,
        });
        relay.serve(listener);
        relay
    }

    /// `url` with its host and port replaced by the relay's.
    pub fn url(&self, url: &Url) -> Url {
        let mut relayed = url.clone();
        relayed
            .set_host(Some(&self.address.ip().to_string()))
            .expect("a URL with a host");
        relayed
            .set_port(Some(self.address.port()))
            .expect("a URL with a port");
        relayed
    }

    /// The service goes away: the port stops listening and every relayed connection closes.
    pub fn cut(&self) {
        if let Some(serving) = self.lock().take() {
            // Aborting the accept loop drops the listener and its JoinSet, which aborts every
            // connection's task and so closes both of its sockets.
            serving.abort();
        }
    }

    /// The service goes silent: every relayed connection, and every one accepted after, stays
    /// open and carries nothing more in either direction (no reset, no close).
    pub fn stall(&self) {
        self.stalled.send_replace(true);
    }

    /// The service is back, on the same port.
    pub async fn restore(&self) {
        self.cut();
        self.stalled.send_replace(false);
        // The aborted task releases the port when it is dropped; retry briefly until then.
        let mut attempts = 0;
        let listener = loop {
            match TcpListener::bind(self.address).await {
                Ok(listener) => break listener,
                Err(e) if attempts < 50 => {
                    attempts += 1;
                    tracing::debug!(error = %e, "relay port not free yet");
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
                Err(e) => panic!("rebind the relay on {}: {e}", self.address),
            }
        };
        self.serve(listener);
    }

    fn serve(&self, listener: TcpListener) {
        let target = self.target;
        let stalled = self.stalled.subscribe();
        let serving = tokio::spawn(async move {
            let mut connections = JoinSet::new();
            while let Ok((mut client, _)) = listener.accept().await {
                let mut stalled = stalled.clone();
                connections.spawn(async move {
                    if let Ok(mut service) = TcpStream::connect(target).await {
                        tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut client, &mut service) => {}
                            // Both sockets stay open, held by this task until the relay is cut.
                            () = async { drop(stalled.wait_for(|stalled| *stalled).await) } => {
                                std::future::pending::<()>().await;
                            }
                        }
                    }
                });
            }
        });
        *self.lock() = Some(serving);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<JoinHandle<()>>> {
        self.running
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.cut();
    }
}

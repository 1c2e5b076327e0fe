//! A port that swallows connection attempts, as the address of a host gone from the network does.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

/// A listener on a loopback port that never accepts, its accept queue filled: the kernel then
/// drops the SYNs the port gets, so that a connection attempt waits for its own timeout (where a
/// killed process on a live host refuses at once). Dropping it frees the port.
#[derive(Debug)]
pub struct Blackhole {
    _listener: TcpListener,
    _queued: Vec<TcpStream>,
}

impl Blackhole {
    /// Takes `port` (retrying for up to 2 s while a killed server's socket lets it go) and fills
    /// its accept queue.
    pub fn on(port: u16) -> Blackhole {
        let listener = (0..100)
            .find_map(|_| {
                TcpListener::bind(("127.0.0.1", port))
                    .inspect_err(|_| std::thread::sleep(Duration::from_millis(20)))
                    .ok()
            })
            .unwrap_or_else(|| panic!("port {port} still taken after 2 s"));
        let address: SocketAddr = ([127, 0, 0, 1], port).into();
        let mut queued = Vec::new();
        while let Ok(s) = TcpStream::connect_timeout(&address, Duration::from_millis(100)) {
            queued.push(s);
            assert!(queued.len() < 10_000, "the accept queue never filled");
        }
        Blackhole {
            _listener: listener,
            _queued: queued,
        }
    }
}

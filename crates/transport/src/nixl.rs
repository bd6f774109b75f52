//! NIXL agents for the RDMA lane (feature `nixl`).
//!
//! nixl-sys is built in stub-api mode: it `dlopen`s `libnixl_capi.so` on
//! first use and ABORTS the process if the library is missing. So
//! [`probe`] — optionally `dlopen`ing a configured library path first —
//! asks `nixl_sys::is_stub()` before any other NIXL call, and every
//! constructor here calls it. An unavailable NIXL is
//! [`NixlError::Unavailable`]: callers log it and send inline.
//!
//! - [`SenderAgent`]: registers the [`SlotArena`] with the UCX backend,
//!   serves its metadata on `ip:port`, and releases slots on notifications
//!   ([`SenderAgent::poll_notifications`], run by the reaper thread).
//! - [`ReceiverAgent`]: a registered landing pool; fetches each sender's
//!   metadata once (keyed by `ip:port`, refetched after NOT_FOUND or a
//!   disconnect), READs `nbytes + 16` bytes with a bounded timeout, checks
//!   both generation stamps and notifies with the slot key.

use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use nixl_sys::{
    Agent, AgentConfig, Backend, MemType, MemoryRegion, NixlDescriptor, NotificationMap, OptArgs,
    RegistrationHandle, ThreadSync, XferDescList, XferOp, XferStatus,
};

use crate::arena::{SlotArena, TickHook, ARENA_ALIGN};
use crate::descriptor::{check_frame, Descriptor, FRAME_OVERHEAD};
use crate::receiver::{RemoteError, RemoteReader};

/// The backend both sides use.
pub const BACKEND: &str = "UCX";

/// Why a NIXL operation failed.
#[derive(Debug, thiserror::Error)]
pub enum NixlError {
    #[error("NIXL is unavailable: {0}")]
    Unavailable(String),
    #[error("NIXL {op} failed: {source}")]
    Call {
        op: &'static str,
        #[source]
        source: nixl_sys::NixlError,
    },
    #[error("invalid NIXL setting: {0}")]
    Config(String),
}

fn call(op: &'static str) -> impl FnOnce(nixl_sys::NixlError) -> NixlError {
    move |source| NixlError::Call { op, source }
}

/// Loads `lib` (an absolute path to `libnixl_capi.so`) globally so the
/// stub layer finds it without `LD_LIBRARY_PATH`. The handle is kept for
/// the life of the process.
pub fn load_library(lib: &Path) -> Result<(), NixlError> {
    let path = CString::new(lib.as_os_str().as_encoded_bytes()).map_err(|_| {
        NixlError::Unavailable(format!("library path {} contains NUL", lib.display()))
    })?;
    // SAFETY: `path` is a valid NUL-terminated string; dlopen has no other
    // preconditions. The returned handle is deliberately never closed.
    let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    if handle.is_null() {
        return Err(NixlError::Unavailable(format!(
            "dlopen {}: {}",
            lib.display(),
            dl_error()
        )));
    }
    Ok(())
}

fn dl_error() -> String {
    // SAFETY: dlerror returns NULL or a valid C string owned by libc, which
    // we copy before any other dl* call.
    unsafe {
        let msg = libc::dlerror();
        if msg.is_null() {
            "unknown error".to_owned()
        } else {
            CStr::from_ptr(msg).to_string_lossy().into_owned()
        }
    }
}

/// Loads `lib` if given, then checks that the real NIXL library is there.
/// Must precede every other NIXL call.
pub fn probe(lib: Option<&Path>) -> Result<(), NixlError> {
    if let Some(lib) = lib {
        load_library(lib)?;
    }
    if nixl_sys::is_stub() {
        return Err(NixlError::Unavailable(
            "libnixl_capi.so not found (set --nixl-lib or LD_LIBRARY_PATH)".into(),
        ));
    }
    Ok(())
}

/// A memory range to register (the arena or the landing pool).
#[derive(Debug)]
struct Region {
    addr: usize,
    len: usize,
}

impl MemoryRegion for Region {
    /// The region start; valid while the arena or landing pool that owns
    /// it lives (the registration is dropped first).
    unsafe fn as_ptr(&self) -> *const u8 {
        self.addr as *const u8
    }

    fn size(&self) -> usize {
        self.len
    }
}

impl NixlDescriptor for Region {
    fn mem_type(&self) -> MemType {
        MemType::Dram
    }

    fn device_id(&self) -> u64 {
        0
    }
}

fn new_agent(name: &str, listen: Option<u16>) -> Result<(Agent, Backend), NixlError> {
    let cfg = AgentConfig {
        enable_prog_thread: true,
        enable_listen_thread: listen.is_some(),
        listen_port: listen.map(i32::from).unwrap_or(nixl_sys::DEFAULT_COMM_PORT),
        thread_sync: ThreadSync::Strict,
        ..AgentConfig::default()
    };
    let agent = Agent::new_configured(name, &cfg).map_err(call("agent creation"))?;
    let (_mems, params) = agent
        .get_plugin_params(BACKEND)
        .map_err(call("plugin parameters"))?;
    let backend = agent
        .create_backend(BACKEND, &params)
        .map_err(call("backend creation"))?;
    Ok((agent, backend))
}

fn backend_args(backend: &Backend) -> Result<OptArgs, NixlError> {
    let mut args = OptArgs::new().map_err(call("option creation"))?;
    args.add_backend(backend).map_err(call("option backend"))?;
    Ok(args)
}

fn register(
    agent: &Agent,
    backend: &Backend,
    addr: usize,
    len: usize,
) -> Result<RegistrationHandle, NixlError> {
    let args = backend_args(backend)?;
    agent
        .register_memory(&Region { addr, len }, Some(&args))
        .map_err(call("memory registration"))
}

/// The sending side: the arena registered with NIXL and a metadata listener.
pub struct SenderAgent {
    // Field order matters: the registration is dropped (deregistered)
    // before the agent and before the arena memory can go away.
    _registration: RegistrationHandle,
    agent: Agent,
    arena: Arc<SlotArena>,
    port: u16,
}

impl std::fmt::Debug for SenderAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SenderAgent")
            .field("name", &self.agent.name())
            .field("port", &self.port)
            .finish_non_exhaustive()
    }
}

impl SenderAgent {
    /// Probes NIXL (loading `lib` first if given), creates agent `name`
    /// listening for metadata requests on `port`, and registers `arena`.
    pub fn start(
        lib: Option<&Path>,
        name: &str,
        port: u16,
        arena: Arc<SlotArena>,
    ) -> Result<SenderAgent, NixlError> {
        probe(lib)?;
        if port == 0 {
            return Err(NixlError::Config(
                "the metadata listener needs a fixed port".into(),
            ));
        }
        if let Some(warning) = crate::remote_reads::software_read_warning() {
            tracing::warn!("{warning}");
        }
        let (agent, backend) = new_agent(name, Some(port))?;
        let registration = register(&agent, &backend, arena.base_addr() as usize, arena.len())?;
        Ok(SenderAgent {
            _registration: registration,
            agent,
            arena,
            port,
        })
    }

    /// The listener port (goes into every descriptor).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The agent's name (receivers are configured with it).
    pub fn name(&self) -> String {
        self.agent.name()
    }

    /// Releases the slots named by pending notifications; returns how many
    /// notifications were seen.
    pub fn poll_notifications(&self) -> Result<usize, NixlError> {
        let mut map = NotificationMap::new().map_err(call("notification map"))?;
        self.agent
            .get_notifications(&mut map, None)
            .map_err(call("get notifications"))?;
        let by_agent = map.take_notifs().map_err(call("read notifications"))?;
        let mut seen = 0;
        for text in by_agent.values().flatten() {
            self.arena.release_notification(text);
            seen += 1;
        }
        Ok(seen)
    }

    /// A reaper hook polling notifications each tick.
    pub fn tick_hook(self: &Arc<Self>) -> TickHook {
        let me = Arc::clone(self);
        Box::new(move |_arena: &SlotArena| {
            if let Err(e) = me.poll_notifications() {
                tracing::warn!(error = %e, "polling NIXL notifications failed");
            }
        })
    }
}

/// Receiver settings.
#[derive(Debug, Clone)]
pub struct ReceiverConfig {
    /// This agent's name.
    pub name: String,
    /// This agent's own metadata listener port. NIXL runs metadata fetches
    /// on the listener thread, so a receiver needs one too.
    pub listen_port: u16,
    /// The senders' agent name (known by configuration, not in descriptors).
    pub sender_name: String,
    /// Landing buffers (concurrent READs).
    pub landing_slots: usize,
    /// Bytes per landing buffer (≥ the sender's slot size).
    pub landing_slot_size: usize,
    /// Longest wait for a free landing buffer.
    pub landing_wait: Duration,
    /// Longest wait for metadata, then for the READ.
    pub read_timeout: Duration,
}

impl ReceiverConfig {
    /// The longest a READ can hold a sender's slot: the landing wait, then
    /// up to two metadata waits and two READs (one retry), each bounded by
    /// `read_timeout`. The sender's arena TTL must exceed it.
    pub fn hold(&self) -> Duration {
        self.landing_wait + self.read_timeout * 4
    }
}

/// Landing buffers: one aligned allocation cut into slots.
struct Landing {
    ptr: std::ptr::NonNull<u8>,
    layout: std::alloc::Layout,
    slot_size: usize,
    free: Mutex<Vec<usize>>,
    freed: Condvar,
}

// SAFETY: the memory is plain bytes; each slot is used by one READ at a
// time (handed out through the `free` list under its lock).
unsafe impl Send for Landing {}
// SAFETY: as above.
unsafe impl Sync for Landing {}

impl Landing {
    fn new(slots: usize, slot_size: usize) -> Result<Landing, NixlError> {
        let bad = || NixlError::Config(format!("landing pool of {slots} × {slot_size} bytes"));
        let len = slots
            .checked_mul(slot_size)
            .filter(|l| *l > 0)
            .ok_or_else(bad)?;
        let layout = std::alloc::Layout::from_size_align(len, ARENA_ALIGN).map_err(|_| bad())?;
        // SAFETY: `len > 0`, so the layout is not zero-sized.
        let ptr =
            std::ptr::NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) }).ok_or_else(bad)?;
        Ok(Landing {
            ptr,
            layout,
            slot_size,
            free: Mutex::new((0..slots).rev().collect()),
            freed: Condvar::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Vec<usize>> {
        self.free.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn take(&self, wait: Duration) -> Option<usize> {
        let deadline = Instant::now() + wait;
        let mut free = self.lock();
        loop {
            if let Some(i) = free.pop() {
                return Some(i);
            }
            let left = deadline.checked_duration_since(Instant::now())?;
            free = self
                .freed
                .wait_timeout(free, left)
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
    }

    fn give_back(&self, slot: usize) {
        self.lock().push(slot);
        self.freed.notify_one();
    }

    fn addr(&self, slot: usize) -> usize {
        self.ptr.as_ptr() as usize + slot * self.slot_size
    }

    /// Copies `len` bytes of a landing slot a READ has completed into.
    fn copy(&self, slot: usize, len: usize) -> Vec<u8> {
        // SAFETY: `slot` is in range and owned by the caller (taken from the
        // free list), its READ completed, and `len ≤ slot_size` was checked.
        unsafe { std::slice::from_raw_parts(self.addr(slot) as *const u8, len) }.to_vec()
    }
}

impl Drop for Landing {
    fn drop(&mut self) {
        // SAFETY: allocated in `Landing::new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// The receiving side: a registered landing pool and a metadata cache.
pub struct ReceiverAgent {
    // Drop order: registration, agent, then the landing memory.
    _registration: RegistrationHandle,
    agent: Agent,
    backend: Backend,
    landing: Landing,
    cfg: ReceiverConfig,
    /// `ip:port` whose metadata is loaded under `cfg.sender_name`.
    peers: Mutex<HashMap<String, ()>>,
}

impl std::fmt::Debug for ReceiverAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReceiverAgent")
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

impl ReceiverAgent {
    /// Probes NIXL (loading `lib` first if given), creates the agent and
    /// registers the landing pool.
    pub fn start(lib: Option<&Path>, cfg: ReceiverConfig) -> Result<ReceiverAgent, NixlError> {
        probe(lib)?;
        let landing = Landing::new(cfg.landing_slots, cfg.landing_slot_size)?;
        let (agent, backend) = new_agent(&cfg.name, Some(cfg.listen_port))?;
        let registration = register(&agent, &backend, landing.addr(0), landing.layout.size())?;
        Ok(ReceiverAgent {
            _registration: registration,
            agent,
            backend,
            landing,
            cfg,
            peers: Mutex::new(HashMap::new()),
        })
    }

    fn peers(&self) -> MutexGuard<'_, HashMap<String, ()>> {
        self.peers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Forgets a sender's metadata (after NOT_FOUND or a disconnect).
    pub fn invalidate(&self, peer: &str) {
        if self.peers().remove(peer).is_some() {
            if let Err(e) = self.agent.invalidate_remote_md(&self.cfg.sender_name) {
                tracing::debug!(error = %e, peer, "invalidating NIXL metadata");
            }
        }
    }

    /// Loads the sender's metadata from `ip:port` unless cached.
    fn ensure_peer(&self, ip: &str, port: u16) -> Result<(), RemoteError> {
        let peer = format!("{ip}:{port}");
        if self.peers().contains_key(&peer) {
            return Ok(());
        }
        // One sender name maps to one address at a time.
        let stale: Vec<String> = self.peers().keys().cloned().collect();
        for old in stale {
            self.invalidate(&old);
        }
        let mut args = backend_args(&self.backend).map_err(nixl_remote)?;
        args.set_ip_addr(ip)
            .map_err(|e| RemoteError::Nixl(e.to_string()))?;
        args.set_port(port)
            .map_err(|e| RemoteError::Nixl(e.to_string()))?;
        self.agent
            .fetch_remote_md(&self.cfg.sender_name, Some(&args))
            .map_err(|e| RemoteError::PeerGone(peer.clone(), format!("metadata fetch: {e}")))?;
        let deadline = Instant::now() + self.cfg.read_timeout;
        while !self
            .agent
            .check_remote_metadata(&self.cfg.sender_name, None)
        {
            if Instant::now() >= deadline {
                return Err(RemoteError::PeerGone(
                    peer,
                    format!("no metadata within {:?}", self.cfg.read_timeout),
                ));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        self.peers().insert(peer, ());
        Ok(())
    }

    /// One READ of `len` bytes from `desc.slot_addr` into landing `slot`.
    fn read_once(&self, desc: &Descriptor, slot: usize, len: usize) -> Result<(), RemoteError> {
        let mut local =
            XferDescList::new(MemType::Dram).map_err(|e| RemoteError::Nixl(e.to_string()))?;
        local.add_desc(self.landing.addr(slot), len, 0);
        let mut remote =
            XferDescList::new(MemType::Dram).map_err(|e| RemoteError::Nixl(e.to_string()))?;
        remote.add_desc(desc.slot_addr as usize, len, 0);
        let mut args = backend_args(&self.backend).map_err(nixl_remote)?;
        args.set_notification_message(desc.notification().as_bytes())
            .map_err(|e| RemoteError::Nixl(e.to_string()))?;
        args.set_has_notification(true)
            .map_err(|e| RemoteError::Nixl(e.to_string()))?;
        let peer = format!("{}:{}", desc.ip, desc.port);
        let gone = |what: &str, e: nixl_sys::NixlError| {
            RemoteError::PeerGone(peer.clone(), format!("{what}: {e}"))
        };
        let req = self
            .agent
            .create_xfer_req(
                XferOp::Read,
                &local,
                &remote,
                &self.cfg.sender_name,
                Some(&args),
            )
            .map_err(|e| gone("transfer request", e))?;
        let mut pending = self
            .agent
            .post_xfer_req(&req, Some(&args))
            .map_err(|e| gone("READ", e))?;
        let deadline = Instant::now() + self.cfg.read_timeout;
        while pending {
            match self
                .agent
                .get_xfer_status(&req)
                .map_err(|e| gone("READ", e))?
            {
                XferStatus::Success => pending = false,
                XferStatus::InProgress if Instant::now() >= deadline => {
                    // The landing slot may still be written: never reuse it.
                    std::mem::forget(req);
                    return Err(RemoteError::Timeout(self.cfg.read_timeout));
                }
                XferStatus::InProgress => std::thread::yield_now(),
            }
        }
        Ok(())
    }

    /// Metadata, READ, and one retry with fresh metadata after a failure.
    fn read_with_retry(
        &self,
        desc: &Descriptor,
        slot: usize,
        len: usize,
    ) -> Result<(), RemoteError> {
        let peer = format!("{}:{}", desc.ip, desc.port);
        self.ensure_peer(&desc.ip, desc.port)?;
        match self.read_once(desc, slot, len) {
            Err(RemoteError::PeerGone(..)) => {
                // A restarted sender answers NOT_FOUND until refetched.
                self.invalidate(&peer);
                self.ensure_peer(&desc.ip, desc.port)?;
                self.read_once(desc, slot, len)
                    .inspect_err(|_| self.invalidate(&peer))
            }
            other => other,
        }
    }
}

fn nixl_remote(e: NixlError) -> RemoteError {
    RemoteError::Nixl(e.to_string())
}

impl RemoteReader for ReceiverAgent {
    fn read(&self, desc: &Descriptor, nbytes: u64) -> Result<Bytes, RemoteError> {
        let max = self.cfg.landing_slot_size.saturating_sub(FRAME_OVERHEAD) as u64;
        if nbytes > max {
            return Err(RemoteError::TooLarge { nbytes, max });
        }
        let nbytes = nbytes as usize;
        let len = nbytes + FRAME_OVERHEAD;
        let slot = self
            .landing
            .take(self.cfg.landing_wait)
            .ok_or(RemoteError::Timeout(self.cfg.landing_wait))?;
        match self.read_with_retry(desc, slot, len) {
            // Quarantined: a READ may still land in this landing slot.
            Err(e @ RemoteError::Timeout(_)) => Err(e),
            Err(e) => {
                self.landing.give_back(slot);
                Err(e)
            }
            Ok(()) => {
                let image = self.landing.copy(slot, len);
                self.landing.give_back(slot);
                check_frame(&image, desc.gen, nbytes)?;
                Ok(Bytes::from(image).slice(8..8 + nbytes))
            }
        }
    }
}

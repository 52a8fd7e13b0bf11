//! The [`Hypervisor`] on libvirt (the `virt` 0.5 crate): one connection per node, libvirt's
//! event loop on a thread of its own, lifecycle events forwarded into channels.
//!
//! # Threads
//!
//! - Every method of [`LibvirtHypervisor`] is a blocking libvirt call made on the caller's
//!   thread. A `virConnect` accepts concurrent calls from several threads (a slow `destroy`
//!   does not hold up a `state` on another thread), so there is no worker thread to queue
//!   behind: callers bring their own thread or use `spawn_blocking`.
//! - libvirt's default event loop runs on one process-wide thread, `libvirt-events`, started
//!   by [`init`] (which every `open` calls first, as libvirt wants the loop registered before
//!   the first connection). The thread lives as long as the process.
//! - Lifecycle events arrive on that thread in `lifecycle_callback`, which only copies the
//!   domain's UUID and name (local accessors, no libvirt round trip) and sends them to every
//!   subscriber's channel. It never blocks and never calls back into libvirt.
//!
//! # A connection that drops
//!
//! A remote connection (`qemu+ssh://…`, `test+unix://…?socket=…`, or `qemu:///system`, which
//! goes through libvirtd's socket) closes when libvirtd restarts or the link goes away; libvirt
//! never reopens it. Every call first asks libvirt whether the connection is still alive
//! (`virConnectIsAlive`, a local check, no round trip) and, when it is not, opens a new one to
//! the same URI — at most once per back-off period ([`RECONNECT_BACKOFF_MIN_MS`] doubling to
//! [`RECONNECT_BACKOFF_MAX_MS`]), so a node that stays down costs one attempt per period, not
//! one per call. The lifecycle-event registration moves to the new connection: subscribers
//! keep their streams. Remote connections get libvirt's keepalive
//! ([`KEEPALIVE_INTERVAL_S`] × [`KEEPALIVE_COUNT`]), so a libvirtd that hangs or a link that
//! silently drops closes the connection too instead of leaving calls waiting.

use std::ffi::CStr;
use std::os::raw::{c_int, c_uchar, c_void};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use uuid::Uuid;
use virt::connect::Connect;
use virt::domain::Domain;
use virt::enumutil::Enum;
use virt::error::{Error as VirtError, ErrorNumber};
use virt::sys;

use crate::error::{DomainRef, HypervisorError};
use crate::hypervisor::{
    DomainStatus, Hypervisor, LifecycleEvent, LifecycleEventKind, OwnedDomain, Resources,
};
use crate::spec::{DomainSpec, InstanceMetadata, METADATA_NAMESPACE_URI};
use crate::xml::{parse_metadata, render_domain};

/// Events a subscriber may leave unread before further events for it are dropped. Events
/// are hints to a level-triggered caller, which re-reads the state anyway; bounding the
/// buffer keeps a stalled subscriber from growing memory or blocking libvirt's event thread.
pub const SUBSCRIBER_BUFFER_EVENTS_MAX: usize = 1024;

/// How long the event thread pauses after `virEventRunDefaultImpl` fails, so that a broken
/// loop logs instead of spinning a core.
const EVENT_LOOP_RETRY_MS: u64 = 100;

/// The wait before the first attempt to reopen a closed connection (each failed attempt
/// doubles it, up to [`RECONNECT_BACKOFF_MAX_MS`]).
pub const RECONNECT_BACKOFF_MIN_MS: u64 = 500;
/// The longest wait between two attempts to reopen a closed connection.
pub const RECONNECT_BACKOFF_MAX_MS: u64 = 30_000;
/// Seconds between libvirt keepalive probes on a remote connection.
pub const KEEPALIVE_INTERVAL_S: i32 = 5;
/// Unanswered keepalive probes after which libvirt closes a remote connection.
pub const KEEPALIVE_COUNT: u32 = 3;

/// Prepares libvirt for this process, once: silences libvirt's default error printer and
/// libxml2's (errors are still returned, see `silence_libxml2`), registers the default event
/// loop and starts the `libvirt-events` thread that runs it. Later calls return the first
/// call's result.
///
/// [`LibvirtHypervisor::open`] calls it; call it yourself before opening a `virt::Connect`
/// of your own in the same process.
pub fn init() -> Result<(), HypervisorError> {
    static INIT: OnceLock<Result<(), VirtError>> = OnceLock::new();
    let result = INIT.get_or_init(|| {
        virt::error::clear_error_callback();
        silence_libxml2(true);
        virt::event::event_register_default_impl()?;
        let spawned = std::thread::Builder::new()
            .name("libvirt-events".into())
            .spawn(|| {
                loop {
                    if let Err(e) = virt::event::event_run_default_impl() {
                        tracing::error!(error = %e, "libvirt event loop iteration failed");
                        std::thread::sleep(Duration::from_millis(EVENT_LOOP_RETRY_MS));
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start the libvirt event thread; no lifecycle events");
        }
        Ok(())
    });
    result.clone().map_err(|source| HypervisorError::Connect {
        uri: "(libvirt event loop)".into(),
        source,
    })
}

/// `void (*xmlGenericErrorFunc)(void *ctx, const char *msg, ...)`: a variadic C function
/// pointer; the no-op below never reads its arguments, so a non-variadic definition is
/// called correctly by the C ABI on every platform libvirt runs on (the caller sets up the
/// arguments, the callee ignores them).
type XmlGenericErrorFunc = Option<unsafe extern "C" fn(*mut c_void, *const std::ffi::c_char)>;

unsafe extern "C" fn ignore_libxml2_message(_ctx: *mut c_void, _msg: *const std::ffi::c_char) {}

/// Stops libxml2 from printing its own warnings on standard error, such as libvirt's test
/// driver's `I/O warning : failed to load external entity "…"` for a missing node file: libvirt
/// reports the same failure as its error, which vmplane shows in its one line. libxml2 keeps the
/// handler per thread (`xmlSetGenericErrorFunc`) with a default for threads that have not used
/// it yet (`xmlThrDefSetGenericErrorFunc`, set when `for_new_threads`); both are looked up in
/// the libxml2 that libvirt loaded (no link-time dependency of vmplane's own on libxml2).
fn silence_libxml2(for_new_threads: bool) {
    type Setter = unsafe extern "C" fn(*mut c_void, XmlGenericErrorFunc);
    let mut names: Vec<&std::ffi::CStr> = vec![c"xmlSetGenericErrorFunc"];
    if for_new_threads {
        names.push(c"xmlThrDefSetGenericErrorFunc");
    }
    for name in names {
        // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name only reads them.
        let symbol = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
        if symbol.is_null() {
            tracing::debug!(symbol = ?name, "libxml2 not found; its warnings may reach stderr");
            continue;
        }
        // SAFETY: both libxml2 functions have this signature (libxml/xmlerror.h,
        // libxml/globals.h); the handler ignores its arguments and lives for the process.
        unsafe {
            let set: Setter = std::mem::transmute::<*mut c_void, Setter>(symbol);
            set(std::ptr::null_mut(), Some(ignore_libxml2_message));
        }
    }
}

/// The subscribers of one connection's lifecycle events. Owned jointly by the hypervisor and
/// by libvirt (through the callback's opaque pointer, released by [`free_fanout`]).
#[derive(Default)]
struct Fanout {
    subscribers: Mutex<Vec<SyncSender<LifecycleEvent>>>,
}

impl Fanout {
    /// Hands the event to every subscriber without blocking; forgets subscribers that are
    /// gone and drops the event for those whose buffer is full.
    fn send(&self, event: LifecycleEvent) {
        let mut subscribers = self.subscribers.lock().unwrap_or_else(|p| p.into_inner());
        subscribers.retain(|tx| match tx.try_send(event.clone()) {
            Ok(()) => true,
            Err(TrySendError::Full(dropped)) => {
                tracing::debug!(uuid = %dropped.uuid, "subscriber buffer full; lifecycle event dropped");
                true
            }
            Err(TrySendError::Disconnected(_)) => false,
        });
    }

    fn close(&self) {
        self.subscribers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }
}

/// Called by libvirt on the event thread for every lifecycle event of the connection.
///
/// # Safety
/// libvirt passes a live `dom` for the duration of the call and the `opaque` pointer given to
/// `virConnectDomainEventRegisterAny`, a `Box<Arc<Fanout>>` that lives until [`free_fanout`].
unsafe extern "C" fn lifecycle_callback(
    _conn: sys::virConnectPtr,
    dom: sys::virDomainPtr,
    event: c_int,
    detail: c_int,
    opaque: *mut c_void,
) -> c_int {
    if dom.is_null() || opaque.is_null() {
        return 0;
    }
    // SAFETY: see the function's contract.
    let fanout = unsafe { &*(opaque as *const Arc<Fanout>) };
    let mut raw_uuid = [0 as c_uchar; 16];
    // SAFETY: `dom` is live and the buffer holds VIR_UUID_BUFLEN (16) bytes.
    if unsafe { sys::virDomainGetUUID(dom, raw_uuid.as_mut_ptr()) } < 0 {
        return 0;
    }
    // SAFETY: `dom` is live; the name belongs to it and is copied before returning.
    let name_ptr = unsafe { sys::virDomainGetName(dom) };
    let name = if name_ptr.is_null() {
        String::new()
    } else {
        // SAFETY: a non-null name is a NUL-terminated string owned by `dom`.
        unsafe { CStr::from_ptr(name_ptr) }
            .to_string_lossy()
            .into_owned()
    };
    fanout.send(LifecycleEvent {
        uuid: Uuid::from_bytes(raw_uuid),
        name,
        kind: LifecycleEventKind::from_raw(event),
        detail,
    });
    0
}

/// Releases the callback's opaque pointer when libvirt drops the registration.
///
/// # Safety
/// `opaque` is the `Box<Arc<Fanout>>` leaked at registration, released exactly once, by libvirt.
unsafe extern "C" fn free_fanout(opaque: *mut c_void) {
    if !opaque.is_null() {
        // SAFETY: see the function's contract.
        drop(unsafe { Box::from_raw(opaque as *mut Arc<Fanout>) });
    }
}

/// Whether a schema-validating define has succeeded in this process.
static SCHEMA_TYPES_BUILT: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);
/// Held by the validating defines that run before one has succeeded.
static FIRST_VALIDATION: Mutex<()> = Mutex::new(());

/// Runs `define`, a schema-validating define, alone if none has succeeded in this process yet.
///
/// libxml2 (2.9 on Debian 12) builds its XML Schema datatype tables lazily, the first time a
/// Relax NG schema that uses them is parsed, and without a lock. Threads whose first
/// validations overlap can see the tables half built, and libvirt then refuses a valid domain:
/// "Unable to parse RNG ...: Error type 'unsignedInt' is not exported by type library" (4 of
/// 200 fresh processes with 8 threads defining at once, on the test driver). Once a validation
/// has succeeded the tables are built and only read, so later defines run side by side.
fn first_validation_alone<T>(
    define: impl FnOnce() -> Result<T, VirtError>,
) -> Result<T, VirtError> {
    use std::sync::atomic::Ordering;
    if SCHEMA_TYPES_BUILT.load(Ordering::Acquire) {
        return define();
    }
    let _alone = FIRST_VALIDATION
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let defined = define();
    if defined.is_ok() {
        SCHEMA_TYPES_BUILT.store(true, Ordering::Release);
    }
    defined
}

/// How a [`LibvirtHypervisor`] behaves beyond its URI.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LibvirtOptions {
    /// Have libvirt check every defined XML against its RNG schema
    /// (`VIR_DOMAIN_DEFINE_VALIDATE`), instead of silently dropping what it does not know.
    ///
    /// Off by default: libvirt loads the schema on every define, which costs about 28 ms a
    /// domain (measured on the test driver; a define without it costs well under 1 ms). The
    /// renderer's output is checked against the same schema by this crate's tests, so the
    /// check buys little at run time; turn it on where a changed renderer is being tried.
    pub validate_schema: bool,
}

/// One libvirt connection, with its lifecycle-event registration.
struct Connection {
    conn: Connect,
    /// The lifecycle registration on `conn`, `None` if libvirt refused it.
    callback_id: Option<c_int>,
}

impl Connection {
    /// Opens `uri`, registers `events` for its lifecycle events and, on a remote connection,
    /// turns libvirt's keepalive on.
    fn open(uri: &str, events: &Arc<Fanout>) -> Result<Connection, HypervisorError> {
        // libxml2's handler is per thread: this thread may parse a node file now.
        silence_libxml2(false);
        let conn = Connect::open(Some(uri)).map_err(|source| HypervisorError::Connect {
            uri: uri.to_owned(),
            source,
        })?;
        let callback_id = register_lifecycle(&conn, events);
        if callback_id.is_none() {
            tracing::warn!(uri, error = %VirtError::last_error(), "lifecycle events unavailable");
        }
        // Local drivers (test://) have no keepalive and refuse it: nothing to do there.
        if let Err(e) = conn.set_keep_alive(KEEPALIVE_INTERVAL_S, KEEPALIVE_COUNT) {
            tracing::debug!(uri, error = %e, "no libvirt keepalive on this connection");
        }
        Ok(Connection { conn, callback_id })
    }

    fn is_alive(&self) -> bool {
        // An error here is a connection libvirt cannot vouch for: treat it as closed.
        self.conn.is_alive().unwrap_or(false)
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        if let Some(id) = self.callback_id {
            // SAFETY: `conn` is a valid handle and `id` came from its registration. libvirt
            // calls `free_fanout` for the opaque pointer once the registration is gone (on a
            // closed connection, when the connection itself goes).
            let rc = unsafe { sys::virConnectDomainEventDeregisterAny(self.conn.as_ptr(), id) };
            if rc < 0 {
                tracing::debug!("cannot deregister lifecycle events (connection closed?)");
            }
        }
    }
}

/// When a closed connection may be reopened next.
#[derive(Debug, Default)]
struct Reconnect {
    /// Failed attempts since the connection was last open.
    failed_attempts: u32,
    /// No attempt before this.
    next_attempt: Option<Instant>,
}

/// The wait after `failed_attempts` failed attempts to reopen a connection.
fn reconnect_backoff(failed_attempts: u32) -> Duration {
    let factor = 1u64 << failed_attempts.min(16);
    Duration::from_millis(
        RECONNECT_BACKOFF_MIN_MS
            .saturating_mul(factor)
            .min(RECONNECT_BACKOFF_MAX_MS),
    )
}

/// One node: a libvirt connection to one URI, reopened when it closes (see the module doc).
pub struct LibvirtHypervisor {
    uri: String,
    options: LibvirtOptions,
    /// The current connection; replaced when it is found closed.
    connection: Mutex<Arc<Connection>>,
    /// Held while a closed connection is being replaced, with the back-off state.
    reconnect: Mutex<Reconnect>,
    events: Arc<Fanout>,
    /// Whether libvirt took the lifecycle registration when the node was opened (if not,
    /// `subscribe` fails).
    events_available: bool,
}

impl std::fmt::Debug for LibvirtHypervisor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LibvirtHypervisor")
            .field("uri", &self.uri)
            .field("options", &self.options)
            .field("events_available", &self.events_available)
            .finish_non_exhaustive()
    }
}

impl LibvirtHypervisor {
    /// Opens a read-write connection to `uri` (`qemu:///system`, `test:///default`,
    /// `test:///abs/path/node.xml`, …) with default options and registers for its lifecycle
    /// events. Blocks.
    pub fn open(uri: &str) -> Result<LibvirtHypervisor, HypervisorError> {
        LibvirtHypervisor::open_with(uri, LibvirtOptions::default())
    }

    /// [`LibvirtHypervisor::open`] with options.
    pub fn open_with(
        uri: &str,
        options: LibvirtOptions,
    ) -> Result<LibvirtHypervisor, HypervisorError> {
        init()?;
        let events = Arc::new(Fanout::default());
        let connection = Connection::open(uri, &events)?;
        Ok(LibvirtHypervisor {
            uri: uri.to_owned(),
            options,
            events_available: connection.callback_id.is_some(),
            connection: Mutex::new(Arc::new(connection)),
            reconnect: Mutex::new(Reconnect::default()),
            events,
        })
    }

    /// The URI this connection was opened with.
    pub fn uri(&self) -> &str {
        &self.uri
    }

    /// The connection to call libvirt on: the current one while libvirt says it is alive,
    /// else a new one (see the module doc), or [`HypervisorError::Reconnecting`] while the
    /// back-off after a failed attempt lasts.
    fn connection(&self) -> Result<Arc<Connection>, HypervisorError> {
        let current = Arc::clone(&self.connection.lock().unwrap_or_else(|p| p.into_inner()));
        if current.is_alive() {
            return Ok(current);
        }
        drop(current);
        // One thread reconnects; the others wait for it, then use what it opened.
        let mut reconnect = self.reconnect.lock().unwrap_or_else(|p| p.into_inner());
        let current = Arc::clone(&self.connection.lock().unwrap_or_else(|p| p.into_inner()));
        if current.is_alive() {
            return Ok(current);
        }
        let now = Instant::now();
        if let Some(next) = reconnect.next_attempt
            && now < next
        {
            return Err(HypervisorError::Reconnecting {
                uri: self.uri.clone(),
                retry_in_ms: u64::try_from((next - now).as_millis()).unwrap_or(u64::MAX),
            });
        }
        if reconnect.failed_attempts == 0 {
            tracing::warn!(uri = %self.uri, "libvirt connection closed; reconnecting");
        }
        match Connection::open(&self.uri, &self.events) {
            Ok(opened) => {
                let opened = Arc::new(opened);
                *self.connection.lock().unwrap_or_else(|p| p.into_inner()) = Arc::clone(&opened);
                tracing::info!(
                    uri = %self.uri,
                    failed_attempts = reconnect.failed_attempts,
                    "reconnected to libvirt"
                );
                *reconnect = Reconnect::default();
                Ok(opened)
            }
            Err(e) => {
                let wait = reconnect_backoff(reconnect.failed_attempts);
                reconnect.failed_attempts = reconnect.failed_attempts.saturating_add(1);
                reconnect.next_attempt = Some(now + wait);
                tracing::warn!(
                    uri = %self.uri,
                    error = %e,
                    retry_in_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
                    "cannot reconnect to libvirt"
                );
                Err(e)
            }
        }
    }

    /// The domain's current XML (`virsh dumpxml`), for a vmplane domain only. Blocks.
    pub fn domain_xml(&self, uuid: Uuid) -> Result<String, HypervisorError> {
        let (dom, _) = self.lookup_owned(uuid, "read the XML of")?;
        dom.xml_desc(0).map_err(|source| HypervisorError::Domain {
            domain: domain_ref(&dom, uuid),
            operation: "read XML",
            source,
        })
    }

    fn node_error(&self, operation: &'static str) -> impl FnOnce(VirtError) -> HypervisorError {
        let uri = self.uri.clone();
        move |source| HypervisorError::Node {
            uri,
            operation,
            source,
        }
    }

    /// Looks the domain up and reads its vmplane metadata; refuses a domain without it.
    fn lookup_owned(
        &self,
        uuid: Uuid,
        operation: &'static str,
    ) -> Result<(Domain, InstanceMetadata), HypervisorError> {
        let unnamed = DomainRef { uuid, name: None };
        let connection = self.connection()?;
        let dom = connection
            .conn
            .lookup_domain_by_uuid(uuid)
            .map_err(|source| {
                if is(&source, ErrorNumber::NoDomain) {
                    HypervisorError::NotFound {
                        domain: unnamed.clone(),
                    }
                } else {
                    HypervisorError::Domain {
                        domain: unnamed.clone(),
                        operation: "lookup",
                        source,
                    }
                }
            })?;
        let domain = domain_ref(&dom, uuid);
        match read_metadata(&dom, &domain)? {
            Some(metadata) => Ok((dom, metadata)),
            None => Err(HypervisorError::NotOwned { domain, operation }),
        }
    }

    /// Runs a stop call, treating "not running" as done: the caller wanted it stopped.
    fn stop_with(
        &self,
        uuid: Uuid,
        operation: &'static str,
        call: impl FnOnce(&Domain) -> Result<(), VirtError>,
    ) -> Result<(), HypervisorError> {
        let (dom, _) = self.lookup_owned(uuid, operation)?;
        let domain = domain_ref(&dom, uuid);
        if !domain_status(&dom, &domain)?.is_active() {
            return Ok(());
        }
        match call(&dom) {
            Ok(()) => Ok(()),
            // It stopped between the check and the call (libvirt: "domain is not running").
            Err(e)
                if is(&e, ErrorNumber::OperationInvalid)
                    && !domain_status(&dom, &domain)?.is_active() =>
            {
                Ok(())
            }
            Err(source) => Err(HypervisorError::Domain {
                domain,
                operation,
                source,
            }),
        }
    }
}

impl Drop for LibvirtHypervisor {
    fn drop(&mut self) {
        // Subscribers see their stream end even if libvirt frees the callback data later (the
        // connection deregisters its callback when it is dropped).
        self.events.close();
    }
}

/// The error a `return` fail point injects (see `hypervisor/tests/failpoints.rs`): a libvirt
/// error as the call would have returned it.
// Used only where `fail/failpoints` is on (this crate's `failpoints`, or another crate's, since
// cargo unifies `fail`'s features).
#[cfg_attr(not(feature = "failpoints"), allow(dead_code))]
fn injected(domain: DomainRef, operation: &'static str) -> HypervisorError {
    let source = match std::ffi::CString::new("injected by a fail point\0") {
        Err(nul) => virt::error::Error::from(nul),
        Ok(_) => virt::error::Error::last_error(),
    };
    HypervisorError::Domain {
        domain,
        operation,
        source,
    }
}

fn register_lifecycle(conn: &Connect, events: &Arc<Fanout>) -> Option<c_int> {
    let opaque = Box::into_raw(Box::new(Arc::clone(events))) as *mut c_void;
    let callback: sys::virConnectDomainEventCallback = Some(lifecycle_callback);
    // SAFETY: libvirt's VIR_DOMAIN_EVENT_CALLBACK() cast: for the LIFECYCLE event id libvirt
    // calls the pointer with the lifecycle signature. Both are `Option<extern "C" fn>` of the
    // same size.
    let generic: sys::virConnectDomainEventGenericCallback =
        unsafe { std::mem::transmute(callback) };
    // SAFETY: the connection is open; on success libvirt owns `opaque` and frees it with
    // `free_fanout`.
    let id = unsafe {
        sys::virConnectDomainEventRegisterAny(
            conn.as_ptr(),
            std::ptr::null_mut(),
            sys::VIR_DOMAIN_EVENT_ID_LIFECYCLE as c_int,
            generic,
            opaque,
            Some(free_fanout),
        )
    };
    if id < 0 {
        // SAFETY: registration failed, so libvirt did not take the pointer; we still own it.
        unsafe { free_fanout(opaque) };
        None
    } else {
        Some(id)
    }
}

fn is(e: &VirtError, number: ErrorNumber) -> bool {
    e.code() == Enum::Known(number)
}

fn domain_ref(dom: &Domain, uuid: Uuid) -> DomainRef {
    DomainRef {
        uuid,
        name: dom.name().ok(),
    }
}

/// vmplane's metadata of `dom`: `None` if it has none, an error if it has unreadable one.
fn read_metadata(
    dom: &Domain,
    domain: &DomainRef,
) -> Result<Option<InstanceMetadata>, HypervisorError> {
    let fragment = match dom.metadata(
        sys::VIR_DOMAIN_METADATA_ELEMENT as i32,
        Some(METADATA_NAMESPACE_URI),
        0,
    ) {
        Ok(fragment) => fragment,
        Err(e) if is(&e, ErrorNumber::NoDomainMetadata) => return Ok(None),
        Err(source) => {
            return Err(HypervisorError::Domain {
                domain: domain.clone(),
                operation: "read metadata",
                source,
            });
        }
    };
    match parse_metadata(&fragment) {
        Ok(Some(metadata)) => Ok(Some(metadata)),
        Ok(None) => Err(HypervisorError::Metadata {
            domain: domain.clone(),
            source: crate::error::MetadataError::new("libvirt returned no instance element"),
        }),
        Err(source) => Err(HypervisorError::Metadata {
            domain: domain.clone(),
            source,
        }),
    }
}

/// The domain's state, read with `virDomainGetState` directly: virt 0.5's `Domain::state`
/// drops the call's error and reports an unknown state instead.
fn domain_status(dom: &Domain, domain: &DomainRef) -> Result<DomainStatus, HypervisorError> {
    let mut state: c_int = -1;
    let mut reason: c_int = -1;
    // SAFETY: `dom` is a live domain handle; both out-pointers are valid for writes.
    let rc = unsafe { sys::virDomainGetState(dom.as_ptr(), &mut state, &mut reason, 0) };
    if rc < 0 {
        return Err(HypervisorError::Domain {
            domain: domain.clone(),
            operation: "get state",
            source: VirtError::last_error(),
        });
    }
    Ok(DomainStatus::from_raw(state, reason))
}

impl Hypervisor for LibvirtHypervisor {
    fn node_capacity(&self) -> Result<Resources, HypervisorError> {
        let info = self
            .connection()?
            .conn
            .node_info()
            .map_err(self.node_error("node info"))?;
        Ok(Resources {
            vcpus: info.cpus,
            memory_bytes: info.memory.saturating_mul(1024),
        })
    }

    fn list_owned(&self) -> Result<Vec<OwnedDomain>, HypervisorError> {
        let domains = self
            .connection()?
            .conn
            .list_all_domains(0)
            .map_err(self.node_error("list domains"))?;
        let mut owned = Vec::new();
        for dom in domains {
            let uuid = match dom.uuid() {
                Ok(uuid) => uuid,
                Err(e) => {
                    tracing::warn!(uri = %self.uri, error = %e, "skipping a domain without a readable UUID");
                    continue;
                }
            };
            let domain = domain_ref(&dom, uuid);
            let found = read_metadata(&dom, &domain).and_then(|m| {
                m.map(|m| domain_status(&dom, &domain).map(|s| (m, s)))
                    .transpose()
            });
            match found {
                Ok(Some((metadata, status))) => owned.push(OwnedDomain {
                    name: domain.name.clone().unwrap_or_default(),
                    uuid,
                    metadata,
                    status,
                }),
                Ok(None) => {}
                // Gone between the listing and the look: nothing to report.
                Err(HypervisorError::Domain { source, .. })
                    if is(&source, ErrorNumber::NoDomain) => {}
                Err(e) => {
                    tracing::warn!(uri = %self.uri, error = %e, "skipping a vmplane-marked domain")
                }
            }
        }
        Ok(owned)
    }

    fn define(&self, spec: &DomainSpec) -> Result<(), HypervisorError> {
        let domain = DomainRef {
            uuid: spec.firmware_uuid,
            name: Some(spec.name.to_string()),
        };
        let xml = render_domain(spec).map_err(|source| HypervisorError::InvalidSpec {
            domain: domain.clone(),
            source,
        })?;
        match self.lookup_owned(spec.firmware_uuid, "define") {
            Ok(_) | Err(HypervisorError::NotFound { .. }) => {}
            Err(e) => return Err(e),
        }
        let flags = if self.options.validate_schema {
            sys::VIR_DOMAIN_DEFINE_VALIDATE
        } else {
            0
        };
        fail::fail_point!("hypervisor::libvirt::define", |_| Err(injected(
            domain.clone(),
            "define"
        )));
        let connection = self.connection()?;
        let defined = if self.options.validate_schema {
            first_validation_alone(|| connection.conn.define_domain_xml_flags(&xml, flags))
        } else {
            connection.conn.define_domain_xml_flags(&xml, flags)
        };
        defined
            .map(drop)
            .map_err(|source| HypervisorError::Domain {
                domain: domain.clone(),
                operation: "define",
                source,
            })?;
        // libvirt defined it, but the answer is lost (a dropped connection, a crash).
        fail::fail_point!("hypervisor::libvirt::after_define", |_| Err(injected(
            domain, "define"
        )));
        Ok(())
    }

    fn start(&self, uuid: Uuid) -> Result<(), HypervisorError> {
        let (dom, _) = self.lookup_owned(uuid, "start")?;
        let domain = domain_ref(&dom, uuid);
        if domain_status(&dom, &domain)?.is_active() {
            return Ok(());
        }
        fail::fail_point!("hypervisor::libvirt::start", |_| Err(injected(
            domain.clone(),
            "start"
        )));
        match dom.create() {
            Ok(_) => {
                // libvirt started it, but the answer is lost.
                fail::fail_point!("hypervisor::libvirt::after_start", |_| Err(injected(
                    domain.clone(),
                    "start"
                )));
                Ok(())
            }
            // Started by someone else between the check and the call.
            Err(e)
                if is(&e, ErrorNumber::OperationInvalid)
                    && domain_status(&dom, &domain)?.is_active() =>
            {
                Ok(())
            }
            Err(source) => Err(HypervisorError::Domain {
                domain,
                operation: "start",
                source,
            }),
        }
    }

    fn shutdown(&self, uuid: Uuid) -> Result<(), HypervisorError> {
        self.stop_with(uuid, "shutdown", |dom| dom.shutdown().map(drop))
    }

    fn destroy(&self, uuid: Uuid) -> Result<(), HypervisorError> {
        self.stop_with(uuid, "destroy", |dom| dom.destroy().map(drop))
    }

    fn undefine(&self, uuid: Uuid) -> Result<(), HypervisorError> {
        let (dom, _) = self.lookup_owned(uuid, "undefine")?;
        let domain = domain_ref(&dom, uuid);
        // Remove the EFI variable store with the definition; drivers that keep none (the test
        // driver) refuse the flag, and then a plain undefine is the same thing.
        match dom.undefine_flags(sys::VIR_DOMAIN_UNDEFINE_NVRAM) {
            Ok(()) => Ok(()),
            Err(e) if is(&e, ErrorNumber::InvalidArg) || is(&e, ErrorNumber::NoSupport) => dom
                .undefine()
                .map(drop)
                .map_err(|source| HypervisorError::Domain {
                    domain,
                    operation: "undefine",
                    source,
                }),
            Err(source) => Err(HypervisorError::Domain {
                domain,
                operation: "undefine",
                source,
            }),
        }
    }

    fn state(&self, uuid: Uuid) -> Result<DomainStatus, HypervisorError> {
        let (dom, _) = self.lookup_owned(uuid, "read the state of")?;
        domain_status(&dom, &domain_ref(&dom, uuid))
    }

    fn subscribe(&self) -> Result<Receiver<LifecycleEvent>, HypervisorError> {
        if !self.events_available {
            return Err(HypervisorError::EventsUnavailable {
                uri: self.uri.clone(),
            });
        }
        let (tx, rx) = mpsc::sync_channel(SUBSCRIBER_BUFFER_EVENTS_MAX);
        self.events
            .subscribers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(tx);
        Ok(rx)
    }
}

//! The gRPC side of the hollow host: flintlock's `MicroVM` service with flintlock's processing
//! order, codes and texts (`flintlock-and-reference.md` A2, A3.2).
//!
//! Divergence: a network interface with `overrides {}` but no `bridge_name` crashes flintlockd
//! (nil dereference); the hollow host answers `InvalidArgument` instead.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;

use base64::Engine as _;
use futures::Stream;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status};

use super::{Host, Vm, metadata, validate};
use crate::client::Method;
use crate::proto::services::micro_vm_server::MicroVm;
use crate::proto::services::{
    CreateMicroVmRequest, CreateMicroVmResponse, DeleteMicroVmRequest, GetMicroVmRequest,
    GetMicroVmResponse, ListMessage, ListMicroVMsRequest, ListMicroVMsResponse,
};
use crate::proto::types as pb;
use crate::types::MicrovmState;

const CAP_METADATA_SERVICE: &str = "metadata-service";
const CAP_MACVTAP: &str = "macvtap";
const CAP_VIRTIOFS: &str = "virtiofs";
const CAP_VSOCK: &str = "vsock";

/// flintlock's providers and their capabilities (A2.2).
pub(crate) const PROVIDERS: &[(&str, &[&str])] = &[
    ("firecracker", &[CAP_METADATA_SERVICE, CAP_VSOCK]),
    (
        "cloudhypervisor",
        &["auto-start", CAP_MACVTAP, CAP_VIRTIOFS, CAP_VSOCK],
    ),
];

const AUTH_EXTRACT: &str =
    "could not extract token from request header: rpc error: code = Unauthenticated desc = ";

pub(crate) struct Service {
    host: Arc<Host>,
}

impl Service {
    pub(crate) fn new(host: Arc<Host>) -> Self {
        Service { host }
    }

    /// What happens before every handler: count, simulated latency, basic auth (flintlockd's
    /// interceptor runs on every method).
    async fn enter(&self, method: Method, metadata: &MetadataMap) -> Result<(), Status> {
        self.host.counters.add(method);
        let latency = self.host.state().latency;
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        self.authenticate(metadata)
    }

    /// go-grpc-middleware's `AuthFromMD(ctx, "basic")` followed by flintlock's token comparison.
    fn authenticate(&self, metadata: &MetadataMap) -> Result<(), Status> {
        let Some(token) = self
            .host
            .config
            .basic_auth_token
            .as_ref()
            .filter(|token| !token.is_empty())
        else {
            return Ok(());
        };
        let header = metadata
            .get("authorization")
            .and_then(|value| value.to_str().ok())
            .unwrap_or_default();
        if header.is_empty() {
            return Err(Status::unauthenticated(format!(
                "{AUTH_EXTRACT}Request unauthenticated with basic"
            )));
        }
        let Some((scheme, supplied)) = header.split_once(' ') else {
            return Err(Status::unauthenticated(format!(
                "{AUTH_EXTRACT}Bad authorization string"
            )));
        };
        if !scheme.eq_ignore_ascii_case("basic") {
            return Err(Status::unauthenticated(format!(
                "{AUTH_EXTRACT}Request unauthenticated with basic"
            )));
        }
        if supplied.is_empty() {
            return Err(Status::unauthenticated(
                "invalid auth token: empty authentication token",
            ));
        }
        let expected = base64::engine::general_purpose::STANDARD.encode(token.expose());
        if supplied != expected {
            return Err(Status::unauthenticated(
                "invalid auth token: failed basic authentication. Check the token supplied",
            ));
        }
        Ok(())
    }

    /// CreateMicroVM, in flintlock's order (A2.1).
    fn create(&self, request: CreateMicroVmRequest) -> Result<pb::MicroVm, Status> {
        let Some(mut spec) = request.microvm else {
            return Err(Status::invalid_argument(
                "invalid create microvm request: MicroVMSpec required",
            ));
        };

        // Image references are cleaned, not refused.
        let kernel = spec.kernel.get_or_insert_with(Default::default);
        sanitise(&mut kernel.image);
        if let Some(initrd) = &mut spec.initrd {
            sanitise(&mut initrd.image);
        }
        for volume in spec
            .root_volume
            .iter_mut()
            .chain(spec.additional_volumes.iter_mut())
        {
            if let Some(image) = volume
                .source
                .as_mut()
                .and_then(|source| source.container_source.as_mut())
            {
                sanitise(image);
            }
        }

        // Conversion to flintlock's model.
        if spec.id.is_empty() {
            return Err(Status::unknown(
                "converting request: creating vmid from spec: name is required",
            ));
        }
        if spec.interfaces.iter().any(|iface| {
            iface
                .overrides
                .as_ref()
                .is_some_and(|o| o.bridge_name.is_none())
        }) {
            return Err(Status::invalid_argument(
                "invalid create microvm request: network interface overrides need bridge_name",
            ));
        }
        if spec.namespace.is_empty() {
            spec.namespace = "default".to_owned();
        }
        if spec.vcpu == 0 {
            spec.vcpu = 2;
        }
        if spec.memory_in_mb == 0 {
            spec.memory_in_mb = 1024;
        }

        let mut failures = validate::validate(&spec);
        if failures.is_empty()
            && let Some(kernel) = &spec.kernel
            && self.host.state().refused_images.contains(&kernel.image)
        {
            // A host whose checks are stricter than ours (another flintlock version).
            failures.push(
                "Key: 'MicroVM.Spec.Kernel.Image' Error:Field validation for 'Image' failed on the 'imageURI' tag"
                    .to_string(),
            );
        }
        if !failures.is_empty() {
            return Err(Status::unknown(format!(
                "creating microvm: an error occurred when attempting to validate microvm spec: validation failures found: {}",
                failures.join("\n")
            )));
        }

        let provider = spec
            .provider
            .clone()
            .filter(|provider| !provider.is_empty())
            .unwrap_or_else(|| self.host.config.default_provider.clone());
        let Some((_, capabilities)) = PROVIDERS.iter().find(|(name, _)| *name == provider) else {
            return Err(Status::unknown(format!(
                "creating microvm: microvm provider {provider} isn't available"
            )));
        };
        let has = |capability: &str| capabilities.contains(&capability);

        let mut state = self.host.state();
        let uid = state.ulids.next();

        let macvtap = pb::network_interface::IfaceType::Macvtap as i32;
        if spec.interfaces.iter().any(|iface| iface.r#type == macvtap) && !has(CAP_MACVTAP) {
            return Err(Status::unknown(
                "creating microvm: macvtap network interfaces not supported by the microvm provider",
            ));
        }
        let virtiofs = spec
            .root_volume
            .iter()
            .chain(&spec.additional_volumes)
            .any(|volume| {
                volume
                    .source
                    .as_ref()
                    .is_some_and(|source| source.virtiofs_source.is_some())
            });
        if virtiofs && !has(CAP_VIRTIOFS) {
            return Err(Status::unknown(
                "creating microvm: virtiofs not supported by the microvm provider",
            ));
        }
        if spec.allow_guest_agent && !has(CAP_VSOCK) {
            return Err(Status::unknown(
                "creating microvm: guest agent (vsock) not supported by the microvm provider",
            ));
        }

        metadata::inject_instance_id(&mut spec.metadata, &uid).map_err(|err| {
            Status::unknown(format!("creating microvm: adding instance data: {err}"))
        })?;

        if has(CAP_METADATA_SERVICE)
            && !spec
                .interfaces
                .iter()
                .any(|iface| iface.device_id == "eth0")
        {
            spec.interfaces.insert(0, metadata_interface());
        }

        let record = pb::MicroVm {
            version: 1,
            spec: Some(stored_spec(spec, &uid)),
            status: Some(pb::MicroVmStatus {
                state: i32::from(MicrovmState::Pending),
                ..Default::default()
            }),
        };
        let doomed = state.doomed_creates > 0;
        if doomed {
            state.doomed_creates -= 1;
        }
        state.vms.insert(
            uid.clone(),
            Vm {
                record: record.clone(),
                provider,
                doomed,
                holds_resources: false,
                last_failure: None,
                removal_started: false,
                not_before: None,
                deleted_at: None,
            },
        );
        let provision_time = state.provision_time;
        drop(state);
        tracing::debug!(endpoint = %self.host.endpoint, %uid, "hollow host: microvm PENDING");
        tokio::spawn(self.host.clone().provision(uid, provision_time));
        Ok(record)
    }

    fn get(&self, uid: &str) -> Result<pb::MicroVm, Status> {
        if uid.is_empty() {
            return Err(Status::invalid_argument("invalid request"));
        }
        let state = self.host.state();
        let Some(vm) = state.vms.get(uid) else {
            return Err(Status::unknown(format!(
                "getting microvm: error attempting to locate microvm with uid: {uid}: microvm spec //{uid} not found"
            )));
        };
        if let Some(why) = unreadable(&vm.record) {
            return Err(Status::unknown(format!(
                "getting microvm: error attempting to locate microvm with uid: {uid}: getting vm spec from store: {why}"
            )));
        }
        Ok(vm.record.clone())
    }

    /// The records in `namespace` (empty = all) named `name` (if given and not empty), in uid
    /// order (flintlockd answers in no particular order). One unreadable record fails the list.
    fn list(&self, namespace: &str, name: Option<&str>) -> Result<Vec<pb::MicroVm>, Status> {
        let state = self.host.state();
        let name = name.filter(|name| !name.is_empty());
        let records: Vec<pb::MicroVm> = state
            .vms
            .values()
            .filter(|vm| {
                let spec = vm.record.spec.as_ref();
                let namespace_ok =
                    namespace.is_empty() || spec.is_some_and(|spec| spec.namespace == namespace);
                let name_ok = name.is_none_or(|name| spec.is_some_and(|spec| spec.id == name));
                namespace_ok && name_ok
            })
            .map(|vm| vm.record.clone())
            .collect();
        if let Some(why) = records.iter().find_map(unreadable) {
            // Go prints the query, a map, with its keys sorted.
            let query = match name {
                Some(name) => format!("map[name:{name} namespace:{namespace}]"),
                None => format!("map[namespace:{namespace}]"),
            };
            return Err(Status::unknown(format!(
                "getting all microvms: error attempting to list microvms: {query}: getting microvm spec: {why}"
            )));
        }
        Ok(records)
    }

    fn delete(&self, uid: &str) -> Result<(), Status> {
        if uid.is_empty() {
            return Err(Status::invalid_argument("invalid request"));
        }
        let mut state = self.host.state();
        let Some(vm) = state.vms.get_mut(uid) else {
            return Err(Status::unknown(format!(
                "deleting microvm: checking to see if spec exists: microvm spec //{uid} not found"
            )));
        };
        if let Some(why) = unreadable(&vm.record) {
            return Err(Status::unknown(format!(
                "deleting microvm: checking to see if spec exists: getting vm spec from store: {why}"
            )));
        }
        // flintlockd saves `deleted_at` (Unix seconds), DELETING and retry 0, and its store skips
        // a save that changes nothing: a repeated delete within the same second leaves the
        // version as it is, one a second later is a new version.
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.as_secs());
        let unchanged = vm.state() == MicrovmState::Deleting
            && vm.status_mut().retry == 0
            && vm.deleted_at == Some(now);
        if !unchanged {
            vm.set_state(MicrovmState::Deleting);
            vm.status_mut().retry = 0;
            vm.deleted_at = Some(now);
            vm.record.version += 1;
        }
        let start_removal = !vm.removal_started;
        vm.removal_started = true;
        drop(state);
        if start_removal {
            tokio::spawn(self.host.clone().remove(uid.to_owned()));
        }
        Ok(())
    }
}

#[tonic::async_trait]
impl MicroVm for Service {
    async fn create_micro_vm(
        &self,
        request: Request<CreateMicroVmRequest>,
    ) -> Result<Response<CreateMicroVmResponse>, Status> {
        self.enter(Method::Create, request.metadata()).await?;
        let create_latency = self.host.state().create_latency;
        if !create_latency.is_zero() {
            tokio::time::sleep(create_latency).await;
        }
        let microvm = self.create(request.into_inner())?;
        Ok(Response::new(CreateMicroVmResponse {
            microvm: Some(microvm),
        }))
    }

    async fn delete_micro_vm(
        &self,
        request: Request<DeleteMicroVmRequest>,
    ) -> Result<Response<()>, Status> {
        self.enter(Method::Delete, request.metadata()).await?;
        self.delete(&request.get_ref().uid)?;
        Ok(Response::new(()))
    }

    async fn get_micro_vm(
        &self,
        request: Request<GetMicroVmRequest>,
    ) -> Result<Response<GetMicroVmResponse>, Status> {
        self.enter(Method::Get, request.metadata()).await?;
        let microvm = self.get(&request.get_ref().uid)?;
        Ok(Response::new(GetMicroVmResponse {
            microvm: Some(microvm),
        }))
    }

    async fn list_micro_v_ms(
        &self,
        request: Request<ListMicroVMsRequest>,
    ) -> Result<Response<ListMicroVMsResponse>, Status> {
        self.enter(Method::List, request.metadata()).await?;
        let request = request.get_ref();
        let microvm = self.list(&request.namespace, request.name.as_deref())?;
        Ok(Response::new(ListMicroVMsResponse { microvm }))
    }

    type ListMicroVMsStreamStream =
        Pin<Box<dyn Stream<Item = Result<ListMessage, Status>> + Send + 'static>>;

    async fn list_micro_v_ms_stream(
        &self,
        request: Request<ListMicroVMsRequest>,
    ) -> Result<Response<Self::ListMicroVMsStreamStream>, Status> {
        self.enter(Method::ListStream, request.metadata()).await?;
        let namespace = &request.get_ref().namespace;
        if namespace.is_empty() {
            return Err(Status::invalid_argument("invalid request"));
        }
        // flintlock's stream ignores `name`.
        let messages = self.list(namespace, None)?.into_iter().map(|microvm| {
            Ok(ListMessage {
                microvm: Some(microvm),
            })
        });
        Ok(Response::new(Box::pin(futures::stream::iter(messages))))
    }
}

/// Why flintlockd cannot read a stored record back: it stores the id `<namespace>/<name>/<uid>`
/// and parses it by splitting at `/`, so a slash in the name or namespace (which the create
/// accepted) makes every read of the record fail.
pub(crate) fn unreadable(record: &pb::MicroVm) -> Option<String> {
    let spec = record.spec.as_ref()?;
    if !spec.namespace.contains('/') && !spec.id.contains('/') {
        return None;
    }
    let uid = spec.uid.as_deref().unwrap_or_default();
    Some(format!(
        "unmarshalling json content to microvm: parsing vmid from string: unexpected vmid format: {}/{}/{uid}",
        spec.namespace, spec.id
    ))
}

/// Trims whitespace and deletes control characters, as flintlock does to image references.
fn sanitise(image: &mut String) {
    let cleaned: String = image.chars().filter(|c| !c.is_control()).collect();
    *image = cleaned.trim().to_owned();
}

/// The interface flintlock prepends for Firecracker's metadata service (MMDS).
fn metadata_interface() -> pb::NetworkInterface {
    pb::NetworkInterface {
        device_id: "eth0".to_owned(),
        r#type: pb::network_interface::IfaceType::Tap as i32,
        guest_mac: Some("AA:FF:00:00:00:01".to_owned()),
        address: Some(pb::StaticAddress {
            address: "169.254.0.1/16".to_owned(),
            gateway: None,
            nameservers: Vec::new(),
        }),
        overrides: None,
    }
}

/// The spec as flintlock stores and returns it (A2.6): labels, provider, timestamps, mount points
/// and overrides dropped; optional texts and sizes always present.
fn stored_spec(spec: pb::MicroVmSpec, uid: &str) -> pb::MicroVmSpec {
    let kernel = spec.kernel.unwrap_or_default();
    pb::MicroVmSpec {
        id: spec.id,
        namespace: spec.namespace,
        labels: BTreeMap::new(),
        vcpu: spec.vcpu,
        memory_in_mb: spec.memory_in_mb,
        kernel: Some(pb::Kernel {
            image: kernel.image,
            cmdline: kernel.cmdline,
            filename: Some(kernel.filename.unwrap_or_default()),
            add_network_config: kernel.add_network_config,
        }),
        initrd: spec.initrd.map(|initrd| pb::Initrd {
            image: initrd.image,
            filename: Some(initrd.filename.unwrap_or_default()),
        }),
        root_volume: spec
            .root_volume
            .filter(|volume| !is_zero_volume(volume))
            .map(stored_volume),
        additional_volumes: spec
            .additional_volumes
            .into_iter()
            .map(stored_volume)
            .collect(),
        interfaces: spec
            .interfaces
            .into_iter()
            .map(|iface| pb::NetworkInterface {
                device_id: iface.device_id,
                r#type: iface.r#type,
                guest_mac: Some(iface.guest_mac.unwrap_or_default()),
                address: iface.address,
                overrides: None,
            })
            .collect(),
        metadata: spec.metadata,
        created_at: None,
        updated_at: None,
        deleted_at: None,
        uid: Some(uid.to_owned()),
        provider: None,
        allow_guest_agent: spec.allow_guest_agent,
    }
}

fn stored_volume(volume: pb::Volume) -> pb::Volume {
    let source = volume.source.unwrap_or_default();
    pb::Volume {
        id: volume.id,
        is_read_only: volume.is_read_only,
        mount_point: None,
        source: Some(pb::VolumeSource {
            container_source: source.container_source,
            virtiofs_source: source.virtiofs_source,
        }),
        partition_id: Some(volume.partition_id.unwrap_or_default()),
        size_in_mb: Some(volume.size_in_mb.unwrap_or_default()),
    }
}

fn is_zero_volume(volume: &pb::Volume) -> bool {
    volume.id.is_empty()
        && !volume.is_read_only
        && volume.source.as_ref().is_none_or(|source| {
            source.container_source.is_none() && source.virtiofs_source.is_none()
        })
        && volume
            .partition_id
            .as_deref()
            .unwrap_or_default()
            .is_empty()
        && volume.size_in_mb.unwrap_or_default() == 0
}

//! The lifecycle of a hollow microVM: provisioning attempts (with flintlock's backoff and retry
//! budget), the status flintlock records, and removal after a delete.

use std::sync::Arc;
use std::time::Duration;

use super::{Capacity, Host};
use crate::proto::types as pb;
use crate::types::MicrovmState;

/// What a provisioning attempt decided.
enum Attempt {
    Done,
    RetryAfter(Duration),
}

impl Host {
    /// PENDING → (attempts with backoff) → CREATED or FAILED.
    pub(super) async fn provision(self: Arc<Self>, uid: String, provision_time: Duration) {
        let mut wait = provision_time;
        loop {
            if !self.sleep(wait).await {
                return;
            }
            let attempt = self.attempt(&uid);
            match attempt {
                Attempt::Done => return,
                Attempt::RetryAfter(backoff) => wait = backoff,
            }
        }
    }

    fn attempt(&self, uid: &str) -> Attempt {
        let mut state = self.state();
        let state = &mut *state;
        let used = state.used();
        let capacity = state.capacity;
        let Some(vm) = state.vms.get_mut(uid) else {
            return Attempt::Done;
        };
        // An unreadable record fails flintlockd's reconcile before any attempt (and is never
        // retried).
        if vm.state() != MicrovmState::Pending || super::service::unreadable(&vm.record).is_some() {
            return Attempt::Done;
        }
        // flintlock builds the whole plan before running it, and building it records an empty
        // status for the root volume, each container-sourced volume and each interface: a failed
        // attempt shows them, mounts and devices blank.
        let spec = vm.spec();
        let status = vm.status_mut();
        let root = spec.root_volume.as_ref();
        let pulled = spec.additional_volumes.iter().filter(|volume| {
            volume
                .source
                .as_ref()
                .is_some_and(|s| s.container_source.is_some())
        });
        for id in root
            .map(|v| v.id.clone())
            .into_iter()
            .chain(pulled.map(|v| v.id.clone()))
        {
            status
                .volumes
                .entry(id)
                .or_insert_with(|| pb::VolumeStatus {
                    mount: Some(pb::Mount::default()),
                });
        }
        for iface in &spec.interfaces {
            status
                .network_interfaces
                .entry(iface.device_id.clone())
                .or_default();
        }
        let outcome = if vm.doomed {
            Err("injected failure: this create was set to fail (fail_next_creates)".to_owned())
        } else if state.failing_attempts > 0 {
            state.failing_attempts -= 1;
            Err("injected failure: this attempt was set to fail (fail_next_attempts)".to_owned())
        } else if let (false, Some(image)) = (self.config.registry_reachable, first_image(&spec)) {
            let (namespace, name) = (&spec.namespace, &spec.id);
            Err(format!(
                "executing plan: mount images {image} for {namespace}/{name}/{uid}: pulling image using containerd: \
                 failed to resolve reference \"{image}\": the registry is unreachable (hollow host without a registry)"
            ))
        } else if let Some(bad) = spec
            .interfaces
            .iter()
            .find(|iface| !matches!(iface.r#type, 0 | 1))
        {
            Err(format!(
                "network interface {}: unsupported interface type {}",
                bad.device_id, bad.r#type
            ))
        } else {
            check_capacity(capacity, used, vm.vcpu(), vm.memory_mb())
        };
        match outcome {
            Ok(()) => {
                let status = vm.status_mut();
                status.retry = 0;
                status.state = i32::from(MicrovmState::Created);
                fill_created_status(status, &spec, uid);
                vm.record.version += 1;
                vm.holds_resources = true;
                vm.last_failure = None;
                vm.not_before = None;
                tracing::debug!(endpoint = %self.endpoint, uid, "hollow host: microvm CREATED");
                Attempt::Done
            }
            Err(failure) => {
                let status = vm.status_mut();
                status.retry += 1;
                let retry = status.retry;
                vm.record.version += 1;
                tracing::warn!(endpoint = %self.endpoint, uid, retry, failure = %failure, "hollow host: provisioning attempt failed");
                vm.last_failure = Some(failure);
                let factor = u32::try_from(retry).unwrap_or(u32::MAX);
                let backoff = self.scaled(self.config.backoff_base.saturating_mul(factor));
                vm.not_before = tokio::time::Instant::now().checked_add(backoff);
                // Saving the rescheduled record wakes flintlockd's reconcile at once, and its
                // retry check comes before the backoff check: the attempt that takes `retry` past
                // `--maximum-retry` ends the microVM FAILED right away, not after the backoff.
                if retry > self.config.max_retry {
                    vm.set_state(MicrovmState::Failed);
                    vm.record.version += 1;
                    tracing::warn!(
                        endpoint = %self.endpoint, uid, retry,
                        last_failure = vm.last_failure.as_deref().unwrap_or_default(),
                        "hollow host: microvm FAILED after exceeding the retry limit"
                    );
                    return Attempt::Done;
                }
                Attempt::RetryAfter(backoff)
            }
        }
    }

    /// DELETING → removed after the (scaled) delete time, unless deletes hang.
    pub(super) async fn remove(self: Arc<Self>, uid: String) {
        if !self.sleep(self.scaled(self.config.delete_time)).await {
            return;
        }
        let mut hang = self.hang.subscribe();
        while *hang.borrow_and_update() {
            tokio::select! {
                () = self.stopped.cancelled() => return,
                changed = hang.changed() => if changed.is_err() { return },
            }
        }
        // A delete saves DELETING but leaves `not_before` as it was: flintlock's reconcile skips
        // the microVM until its backoff is over, so a microVM deleted while waiting to retry stays
        // DELETING until then.
        let not_before = self.state().vms.get(&uid).and_then(|vm| vm.not_before);
        if let Some(not_before) = not_before {
            tokio::select! {
                () = self.stopped.cancelled() => return,
                () = tokio::time::sleep_until(not_before) => {}
            }
        }
        let mut state = self.state();
        if state
            .vms
            .get(&uid)
            .is_some_and(|vm| vm.state() == MicrovmState::Deleting)
        {
            state.vms.remove(&uid);
            tracing::debug!(endpoint = %self.endpoint, uid, "hollow host: microvm removed");
        }
    }
}

/// The first image flintlock's plan pulls: the root volume's, the other volumes', then the
/// kernel's.
fn first_image(spec: &pb::MicroVmSpec) -> Option<String> {
    let volumes = spec.root_volume.iter().chain(&spec.additional_volumes);
    volumes
        .filter_map(|volume| volume.source.as_ref()?.container_source.clone())
        .chain(spec.kernel.as_ref().map(|kernel| kernel.image.clone()))
        .find(|image| !image.is_empty())
}

fn check_capacity(
    capacity: Option<Capacity>,
    used: Capacity,
    vcpu: i32,
    memory_mb: i32,
) -> Result<(), String> {
    let Some(capacity) = capacity else {
        return Ok(());
    };
    let (vcpu, memory_mb) = (i64::from(vcpu), i64::from(memory_mb));
    if used.vcpu + vcpu > capacity.vcpu || used.memory_mb + memory_mb > capacity.memory_mb {
        return Err(format!(
            "insufficient capacity: needs {vcpu} vCPU and {memory_mb} MiB, host has {} of {} vCPU and {} of {} MiB free",
            capacity.vcpu - used.vcpu,
            capacity.vcpu,
            capacity.memory_mb - used.memory_mb,
            capacity.memory_mb,
        ));
    }
    Ok(())
}

/// What flintlock records once the VMM runs: volume and kernel mounts, host interfaces.
fn fill_created_status(status: &mut pb::MicroVmStatus, spec: &pb::MicroVmSpec, uid: &str) {
    let mut snapshot = 0;
    let mut next_device = || {
        snapshot += 1;
        format!("/dev/mapper/flintlock-thinpool-snap-{uid}-{snapshot}")
    };
    for volume in spec.root_volume.iter().chain(&spec.additional_volumes) {
        let mount = pb::Mount {
            r#type: pb::mount::MountType::Dev as i32,
            source: next_device(),
        };
        status
            .volumes
            .insert(volume.id.clone(), pb::VolumeStatus { mount: Some(mount) });
    }
    let native = "/var/lib/containerd/io.containerd.snapshotter.v1.native/snapshots";
    status.kernel_mount = Some(pb::Mount {
        r#type: pb::mount::MountType::Hostpath as i32,
        source: format!("{native}/{uid}-kernel"),
    });
    if spec.initrd.is_some() {
        status.initrd_mount = Some(pb::Mount {
            r#type: pb::mount::MountType::Hostpath as i32,
            source: format!("{native}/{uid}-initrd"),
        });
    }
    for (index, iface) in spec.interfaces.iter().enumerate() {
        let prefix = if iface.r#type == pb::network_interface::IfaceType::Macvtap as i32 {
            "flvtap"
        } else {
            "fltap"
        };
        let suffix: String = uid
            .bytes()
            .rev()
            .take(7)
            .map(|b| format!("{:x}", b % 16))
            .collect();
        let index = i32::try_from(index).unwrap_or(i32::MAX);
        status.network_interfaces.insert(
            iface.device_id.clone(),
            pb::NetworkInterfaceStatus {
                host_device_name: format!("{prefix}{suffix}{index}")
                    .chars()
                    .take(15)
                    .collect(),
                index: 100 + index,
                mac_address: format!(
                    "02:00:00:00:{:02x}:{:02x}",
                    (index >> 8) & 0xff,
                    index & 0xff
                ),
            },
        );
    }
    if spec.allow_guest_agent {
        status.vsock_path = format!(
            "/var/lib/flintlock/vm/{}/{}/{uid}/guest-agent.vsock",
            spec.namespace, spec.id
        );
    }
}

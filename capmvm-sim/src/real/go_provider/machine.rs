//! The Go provider's MicrovmMachine controller, reproduced from its
//! `controllers/microvmmachine_controller.go` and `internal/scope/machine.go` (reconcileNormal,
//! reconcileDelete, GetFailureDomain).

use anyhow::Context as _;
use capmvm_api::capi::Machine;
use capmvm_api::keys::{CLUSTER_NAME_LABEL, MACHINE_FINALIZER, PAUSED_ANNOTATION};
use capmvm_api::v1alpha1::{self, conditions, vm_states};
use capmvm_flintlock::MicrovmState;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{DynamicObject, Patch, PatchParams};
use kube::{Api, ResourceExt as _};
use serde_json::{Value, json};
use tracing::info;

use super::{Ctx, capi, set_condition, summarize};

impl Ctx {
    pub(super) async fn reconcile_machine(
        &self,
        mvm: &v1alpha1::MicrovmMachine,
    ) -> anyhow::Result<()> {
        let ns = mvm.namespace().unwrap_or_default();
        let name = mvm.name_any();
        let Some(owner) = mvm
            .owner_references()
            .iter()
            .find(|o| o.kind == "Machine" && o.api_version.starts_with("cluster.x-k8s.io/"))
        else {
            return Ok(());
        };
        let machine = match Api::<Machine>::namespaced(self.client.clone(), &ns)
            .get(&owner.name)
            .await
        {
            Ok(m) => m,
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        let Some(cluster_name) = machine.labels().get(CLUSTER_NAME_LABEL).cloned() else {
            return Ok(());
        };
        let Some(cluster) = self
            .get_dynamic(&capi("Cluster", "clusters"), &ns, &cluster_name)
            .await?
        else {
            return Ok(());
        };
        if cluster.data.pointer("/spec/paused") == Some(&json!(true))
            || mvm.annotations().contains_key(PAUSED_ANNOTATION)
        {
            return Ok(());
        }
        let infra_name = cluster
            .data
            .pointer("/spec/infrastructureRef/name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let mc = match Api::<v1alpha1::MicrovmCluster>::namespaced(self.client.clone(), &ns)
            .get(infra_name)
            .await
        {
            Ok(mc) => mc,
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        let api = Api::<v1alpha1::MicrovmMachine>::namespaced(self.client.clone(), &ns);
        let mut status = mvm.status.clone().unwrap_or_default();
        let write_status = |status: v1alpha1::MicrovmMachineStatus| {
            let api = api.clone();
            let name = name.clone();
            let mut status = status;
            summarize(&mut status.conditions, conditions::MICROVM_READY);
            async move {
                api.patch_status(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({ "status": status })),
                )
                .await
            }
        };

        if mvm.metadata.deletion_timestamp.is_some() {
            let domain = failure_domain(&machine, mvm, &cluster)?;
            let client = self.flintlock(&mc, &domain).await?;
            let uid = instance_id(mvm);
            let vm = match client.get(&uid).await {
                Ok(vm) => Some(vm),
                Err(e) if e.to_string().contains("not found") => None,
                Err(e) => return Err(e.into()),
            };
            match vm {
                Some(vm) => {
                    set_condition(
                        &mut status.conditions,
                        conditions::MICROVM_READY,
                        "False",
                        conditions::SEVERITY_INFO,
                        conditions::MICROVM_DELETING,
                        "",
                    );
                    status.ready = false;
                    write_status(status).await?;
                    if vm.status.state != MicrovmState::Deleting {
                        client.delete(&uid).await?;
                    }
                }
                None => {
                    let rest: Vec<String> = mvm
                        .finalizers()
                        .iter()
                        .filter(|f| *f != MACHINE_FINALIZER)
                        .cloned()
                        .collect();
                    api.patch(
                        &name,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"metadata": {"finalizers": rest}})),
                    )
                    .await?;
                    info!(machine = %name, "Go provider: microvm deleted");
                }
            }
            return Ok(());
        }

        let infrastructure_ready = cluster
            .data
            .pointer("/status/initialization/infrastructureProvisioned")
            == Some(&json!(true));
        if !infrastructure_ready {
            set_condition(
                &mut status.conditions,
                conditions::MICROVM_READY,
                "False",
                conditions::SEVERITY_INFO,
                conditions::WAITING_FOR_CLUSTER_INFRA,
                "",
            );
            write_status(status).await?;
            return Ok(());
        }
        let Some(secret_name) = machine.spec.bootstrap.data_secret_name.clone() else {
            set_condition(
                &mut status.conditions,
                conditions::MICROVM_READY,
                "False",
                conditions::SEVERITY_INFO,
                conditions::WAITING_FOR_BOOTSTRAP_DATA,
                "",
            );
            write_status(status).await?;
            return Ok(());
        };
        let domain = failure_domain(&machine, mvm, &cluster)?;
        let client = self.flintlock(&mc, &domain).await?;
        let mut vm = None;
        if mvm.spec.provider_id.is_some() {
            match client.get(&instance_id(mvm)).await {
                Ok(found) => vm = Some(found),
                Err(e) if e.to_string().contains("not found") => {}
                Err(e) => return Err(e.into()),
            }
        }
        if !mvm.finalizers().iter().any(|f| f == MACHINE_FINALIZER) {
            let mut finalizers = mvm.finalizers().to_vec();
            finalizers.push(MACHINE_FINALIZER.to_string());
            api.patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": finalizers}})),
            )
            .await?;
        }
        let vm = match vm {
            Some(vm) => vm,
            None => {
                let secret = Api::<Secret>::namespaced(self.client.clone(), &ns)
                    .get(&secret_name)
                    .await?;
                let value = secret
                    .data
                    .as_ref()
                    .and_then(|d| d.get("value"))
                    .context("missing bootstrap secrey value key")?;
                let spec = self.microvm_spec(mvm, &mc, &cluster_name, &domain, &value.0)?;
                let created = client.create(spec).await?;
                info!(machine = %name, host = %domain, uid = %created.uid(), "Go provider: microvm created");
                created
            }
        };
        let provider_id = format!("microvm://{domain}/{}", vm.uid());
        // Its GetLabels adds cluster-name to the spec's own label map, which the next patch keeps.
        let mut labels = mvm.spec.labels.clone();
        if !labels.is_empty() {
            labels.insert("cluster-name".into(), cluster_name.clone());
        }
        if mvm.spec.provider_id.as_deref() != Some(provider_id.as_str())
            || labels != mvm.spec.labels
        {
            api.patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"providerID": provider_id, "labels": labels}})),
            )
            .await?;
        }
        match vm.status.state {
            MicrovmState::Created => {
                status.vm_state = Some(vm_states::RUNNING.into());
                set_condition(
                    &mut status.conditions,
                    conditions::MICROVM_READY,
                    "True",
                    "",
                    "",
                    "",
                );
                status.ready = true;
            }
            MicrovmState::Pending => {
                status.vm_state = Some(vm_states::PENDING.into());
                set_condition(
                    &mut status.conditions,
                    conditions::MICROVM_READY,
                    "False",
                    conditions::SEVERITY_INFO,
                    conditions::MICROVM_PENDING,
                    "",
                );
                status.ready = false;
            }
            MicrovmState::Failed => {
                status.vm_state = Some(vm_states::FAILED.into());
                set_condition(
                    &mut status.conditions,
                    conditions::MICROVM_READY,
                    "False",
                    "Error",
                    "MicrovmProvisionFailed",
                    "microvm is in a failed state",
                );
                status.ready = false;
            }
            MicrovmState::Deleting => return Ok(()),
            _ => {
                status.vm_state = Some(vm_states::UNKNOWN.into());
                set_condition(
                    &mut status.conditions,
                    conditions::MICROVM_READY,
                    "False",
                    "Error",
                    "MicrovmUnknownState",
                    "microvm is in an unknown/unsupported state",
                );
                status.ready = false;
            }
        }
        let mut summarized = status.clone();
        summarize(&mut summarized.conditions, conditions::MICROVM_READY);
        if mvm.status.as_ref() != Some(&summarized) {
            write_status(status).await?;
        }
        Ok(())
    }
}

/// The uid in the providerID: its last path segment.
fn instance_id(mvm: &v1alpha1::MicrovmMachine) -> String {
    mvm.spec
        .provider_id
        .as_deref()
        .and_then(|p| p.rsplit('/').next())
        .unwrap_or_default()
        .to_string()
}

/// Its GetFailureDomain: the Machine's, else the providerID's, else crc32 of the machine's name
/// over the Cluster's failure domains in sorted order.
fn failure_domain(
    machine: &Machine,
    mvm: &v1alpha1::MicrovmMachine,
    cluster: &DynamicObject,
) -> anyhow::Result<String> {
    if let Some(fd) = machine
        .spec
        .failure_domain
        .as_ref()
        .filter(|f| !f.is_empty())
    {
        return Ok(fd.clone());
    }
    if let Some(pid) = &mvm.spec.provider_id {
        let rest = pid.replace("microvm://", "");
        return Ok(rest.split('/').next().unwrap_or_default().to_string());
    }
    let mut names: Vec<String> = cluster
        .data
        .pointer("/status/failureDomains")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|f| f.get("name").and_then(Value::as_str).map(str::to_string))
        .collect();
    anyhow::ensure!(!names.is_empty(), "no failure domains found on the cluster");
    names.sort();
    let at = crc32_ieee(mvm.name_any().as_bytes()) as usize % names.len();
    Ok(names.swap_remove(at))
}

/// CRC-32 (IEEE), as Go's `crc32.ChecksumIEEE`.
fn crc32_ieee(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for b in bytes {
        crc ^= u32::from(*b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_is_ieee() {
        // Go: crc32.ChecksumIEEE([]byte("123456789")) == 0xcbf43926.
        assert_eq!(crc32_ieee(b"123456789"), 0xcbf4_3926);
        assert_eq!(crc32_ieee(b""), 0);
    }
}

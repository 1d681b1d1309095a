//! The stand-in's Machine controller.

use super::*;

pub(super) async fn reconcile_machine(
    machine: Arc<Machine>,
    ctx: Arc<Ctx>,
) -> Result<Action, Error> {
    let ns = machine.namespace().unwrap_or_default();
    let name = machine.name_any();
    let api: Api<Machine> = Api::namespaced(ctx.client.clone(), &ns);
    let infras: Api<MicrovmMachine> = Api::namespaced(ctx.client.clone(), &ns);
    let infra_name = machine.spec.infrastructure_ref.name.clone();

    if machine.meta().deletion_timestamp.is_some() {
        // CAPI's order: delete the infrastructure machine and wait for it to be gone.
        if !infra_name.is_empty()
            && let Some(infra) = ctx.caches.microvm_machines.get(&ns, &infra_name).await
        {
            if infra.meta().deletion_timestamp.is_none() {
                delete_quietly(&infras, &infra_name).await?;
            }
            return Ok(Action::requeue(Duration::from_secs(2)));
        }
        // Issue 13: the Node goes once the InfraMachine is gone.
        crate::capi::nodes::delete_node(&ctx.workloads, machine.as_ref()).await?;
        remove_finalizer(&api, machine.as_ref(), MACHINE_FINALIZER).await?;
        lock(&ctx.bootstrap_copied).remove(&machine.uid().unwrap_or_default());
        lock(&ctx.adopted).remove(&machine.uid().unwrap_or_default());
        return Ok(Action::await_change());
    }
    ensure_finalizer(&api, machine.as_ref(), MACHINE_FINALIZER).await?;

    // Bootstrap data: the KubeadmConfig's Secret, once the bootstrap provider wrote it.
    let bootstrap_ready = match &machine.spec.bootstrap.data_secret_name {
        Some(_) => true,
        None => adopt_bootstrap_config(&ctx, &machine, &ns).await?,
    };

    let Some(infra) = ctx.caches.microvm_machines.get(&ns, &infra_name).await else {
        ctx.write_status(&api, machine.as_ref(), json!({"phase": "Pending"}))
            .await?;
        return Ok(Action::requeue(Duration::from_secs(5)));
    };
    // Controller ownership of the infrastructure machine moves from the deployment to the Machine.
    let is_controlled = infra.owner_references().iter().any(|o| {
        o.kind == "Machine" && o.controller == Some(true) && Some(&o.uid) == machine.uid().as_ref()
    });
    let infra_uid = infra.uid().unwrap_or_default();
    if (!is_controlled
        || infra.labels().get(CLUSTER_NAME_LABEL) != Some(&machine.spec.cluster_name))
        && !ctx.has_adopted(machine.as_ref(), &infra_uid)
    {
        // A pool's instance keeps its owner reference to the pool (capi-contract 5.3), so the
        // pool's deletion still collects instances whose Machine never appeared.
        let mut owners = vec![owner_ref(machine.as_ref(), true)];
        owners.extend(
            infra
                .owner_references()
                .iter()
                .filter(|o| o.kind == "MicrovmMachinePool" && o.controller != Some(true))
                .cloned(),
        );
        let body = json!({"metadata": {
            "ownerReferences": owners,
            "labels": {CLUSTER_NAME_LABEL: machine.spec.cluster_name},
        }});
        infras
            .patch(&infra_name, &params(), &Patch::Merge(&body))
            .await?;
        ctx.adopted(machine.as_ref(), infra_uid);
    }
    let infra_status = infra.status.clone().unwrap_or_default();
    let provisioned = infra_status
        .initialization
        .as_ref()
        .and_then(|i| i.provisioned)
        == Some(true);
    match (&infra.spec.provider_id, provisioned) {
        (Some(pid), true) => {
            if machine.spec.provider_id.as_ref() != Some(pid) {
                api.patch(
                    &name,
                    &params(),
                    &Patch::Merge(&json!({"spec": {"providerID": pid}})),
                )
                .await?;
            }
            let mut want = json!({
                "initialization": {"infrastructureProvisioned": true, "bootstrapDataSecretCreated": bootstrap_ready},
                "phase": "Running",
                "addresses": infra_status.addresses,
                "failureDomain": infra_status.failure_domain,
            });
            // Issue 13: nodeRef, nodeInfo and the phase from the matching Node.
            crate::capi::nodes::merge_node_status(&ctx.workloads, machine.as_ref(), pid, &mut want);
            ctx.write_status(&api, machine.as_ref(), want).await?;
        }
        _ => {
            // CAPI's phases: Provisioning once the bootstrap data is there, Pending before. One
            // status write per reconcile, as CAPI's patch helper makes: writing Pending and then
            // Provisioning in the same reconcile changed the Machine twice, and each change
            // triggered another reconcile until the bootstrap data came.
            let phase = if bootstrap_ready {
                "Provisioning"
            } else {
                "Pending"
            };
            ctx.write_status(&api, machine.as_ref(), json!({"phase": phase}))
                .await?;
        }
    }
    Ok(Action::requeue(Duration::from_secs(60)))
}

/// Adopts the Machine's KubeadmConfig (controller owner reference, as CAPI's Machine controller sets)
/// and copies its `status.dataSecretName` to the Machine's `spec.bootstrap.dataSecretName`. True once
/// the Machine has its bootstrap data.
async fn adopt_bootstrap_config(ctx: &Ctx, machine: &Machine, ns: &str) -> Result<bool, Error> {
    let uid = machine.uid().unwrap_or_default();
    if lock(&ctx.bootstrap_copied).contains(&uid) {
        return Ok(true);
    }
    let Some(config_ref) = &machine.spec.bootstrap.config_ref else {
        return Ok(false);
    };
    if config_ref.api_group != BOOTSTRAP_GROUP || config_ref.kind != "KubeadmConfig" {
        // Another bootstrap provider's object: nothing in this stand-in renders it.
        return Ok(false);
    }
    let name = config_ref.name.as_str();
    let configs =
        Api::<DynamicObject>::namespaced_with(ctx.client.clone(), ns, &kubeadm_config_resource());
    // A config the MachineDeployment has just created may not be in the cache yet, and until this
    // Machine adopts it no change of the config wakes the Machine. CAPI reads bootstrap objects
    // live (unstructured reads bypass its cache), so a cache miss reads live here too.
    let config = match ctx.caches.kubeadm_configs.get(ns, name).await {
        Some(config) => config,
        None => match configs.get_opt(name).await? {
            Some(config) => Arc::new(config),
            None => return Ok(false),
        },
    };
    let adopted = config.owner_references().iter().any(|o| {
        o.kind == "Machine" && o.controller == Some(true) && Some(&o.uid) == machine.uid().as_ref()
    });
    let config_uid = config.uid().unwrap_or_default();
    if !adopted && !ctx.has_adopted(machine, &config_uid) {
        let body = json!({"metadata": {"ownerReferences": [owner_ref(machine, true)]}});
        configs.patch(name, &params(), &Patch::Merge(&body)).await?;
        ctx.adopted(machine, config_uid);
    }
    let Some(secret) = config
        .data
        .pointer("/status/dataSecretName")
        .and_then(Value::as_str)
    else {
        return Ok(false);
    };
    let body = json!({"spec": {"bootstrap": {"dataSecretName": secret}}});
    Api::<Machine>::namespaced(ctx.client.clone(), ns)
        .patch(&machine.name_any(), &params(), &Patch::Merge(&body))
        .await?;
    // Reconciles that start from a Machine the cache has not updated yet need not copy it again.
    lock(&ctx.bootstrap_copied).insert(uid);
    Ok(true)
}

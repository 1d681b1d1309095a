//! The stand-in's Cluster controller.

use super::*;

pub(super) async fn reconcile_cluster(
    cluster: Arc<Cluster>,
    ctx: Arc<Ctx>,
) -> Result<Action, Error> {
    let ns = cluster.namespace().unwrap_or_default();
    let name = cluster.name_any();
    let api: Api<Cluster> = Api::namespaced(ctx.client.clone(), &ns);
    let mcs: Api<MicrovmCluster> = Api::namespaced(ctx.client.clone(), &ns);
    let infra_name = cluster
        .spec
        .infrastructure_ref
        .as_ref()
        .filter(|r| r.api_group == GROUP && r.kind == "MicrovmCluster")
        .map(|r| r.name.clone());
    // The operator's Cluster view does not model the control plane reference.
    let kcps = Api::<DynamicObject>::namespaced_with(
        ctx.client.clone(),
        &ns,
        &kubeadm_control_plane_resource(),
    );
    let control_plane = control_plane_of(&ctx, &ns, &name).await?;

    if cluster.meta().deletion_timestamp.is_some() {
        // Descendants first: MachineDeployments, the control plane and Machines, then the
        // infrastructure, then the Cluster.
        let mds: Api<MachineDeployment> = Api::namespaced(ctx.client.clone(), &ns);
        for md in mds.list(&ListParams::default()).await? {
            if md.spec.cluster_name == name && md.meta().deletion_timestamp.is_none() {
                delete_quietly(&mds, &md.name_any()).await?;
            }
        }
        if let Some(kcp) = &control_plane {
            delete_quietly(&kcps, kcp).await?;
        }
        let pools_remain = crate::capi::machinepool::delete_pools_of(&ctx, &ns, &name).await?;
        let machines: Api<Machine> = Api::namespaced(ctx.client.clone(), &ns);
        let mine: Vec<Machine> = machines
            .list(&ListParams::default())
            .await?
            .into_iter()
            .filter(|m| m.spec.cluster_name == name)
            .collect();
        for m in &mine {
            // A MachinePool's Machines are its provider's to delete (it is being deleted above).
            let pool_owned = m
                .owner_references()
                .iter()
                .any(|o| o.kind == "MachinePool" && o.controller == Some(true));
            if m.meta().deletion_timestamp.is_none() && !pool_owned {
                delete_quietly(&machines, &m.name_any()).await?;
            }
        }
        if !mine.is_empty() || pools_remain {
            return Ok(Action::requeue(Duration::from_millis(500)));
        }
        if let Some(infra) = &infra_name
            && let Some(mc) = mcs.get_opt(infra).await?
        {
            if mc.meta().deletion_timestamp.is_none() {
                delete_quietly(&mcs, infra).await?;
            }
            return Ok(Action::requeue(Duration::from_millis(500)));
        }
        // Issue 13: the workload API goes with the Cluster.
        ctx.workloads.stop(&ClusterKey::new(&ns, &name)).await;
        remove_finalizer(&api, &cluster, CLUSTER_FINALIZER).await?;
        return Ok(Action::await_change());
    }

    ensure_finalizer(&api, &cluster, CLUSTER_FINALIZER).await?;
    // The control plane: owned by and labelled with the Cluster; its initialization is the Cluster's.
    let mut control_plane_initialized = false;
    if let Some(kcp_name) = &control_plane
        && let Some(kcp) = kcps.get_opt(kcp_name).await?
    {
        let owned = kcp
            .owner_references()
            .iter()
            .any(|o| o.kind == "Cluster" && o.uid == cluster.uid().unwrap_or_default());
        if !owned || kcp.labels().get(CLUSTER_NAME_LABEL) != Some(&name) {
            let mut owners = kcp.owner_references().to_vec();
            if !owned {
                owners.push(owner_ref(cluster.as_ref(), false));
            }
            let body = json!({"metadata": {"ownerReferences": owners, "labels": {CLUSTER_NAME_LABEL: name}}});
            kcps.patch(kcp_name, &params(), &Patch::Merge(&body))
                .await?;
        }
        control_plane_initialized = kcp
            .data
            .pointer("/status/initialization/controlPlaneInitialized")
            .and_then(Value::as_bool)
            == Some(true);
    }
    // Issue 13: the Cluster's workload API and its `<cluster>-kubeconfig` Secret.
    ctx.workloads.ensure(&ctx.client, cluster.as_ref()).await?;
    let Some(infra) = infra_name else {
        return Ok(Action::await_change());
    };
    let Some(mc) = mcs.get_opt(&infra).await? else {
        return Ok(Action::requeue(Duration::from_secs(5)));
    };
    // Ownership and label (since CAPI v1.13 a plain, non-controller owner reference).
    let mut owners = mc.owner_references().to_vec();
    let has_owner = owners
        .iter()
        .any(|o| o.kind == "Cluster" && o.uid == cluster.uid().unwrap_or_default());
    if !has_owner || mc.labels().get(CLUSTER_NAME_LABEL) != Some(&name) {
        if !has_owner {
            owners.push(owner_ref(cluster.as_ref(), false));
        }
        let body =
            json!({"metadata": {"ownerReferences": owners, "labels": {CLUSTER_NAME_LABEL: name}}});
        mcs.patch(&infra, &params(), &Patch::Merge(&body)).await?;
    }
    let provisioned = mc
        .status
        .as_ref()
        .and_then(|s| s.initialization.as_ref())
        .and_then(|i| i.provisioned)
        == Some(true);
    if provisioned {
        // The Cluster's own endpoint wins; ours is copied only when it has none.
        let has_endpoint = cluster
            .spec
            .control_plane_endpoint
            .as_ref()
            .is_some_and(|e| e.is_complete());
        if !has_endpoint
            && let Some(ep) = mc
                .spec
                .control_plane_endpoint
                .as_ref()
                .filter(|e| e.is_complete())
        {
            api.patch(
                &name,
                &params(),
                &Patch::Merge(&json!({"spec": {"controlPlaneEndpoint": ep}})),
            )
            .await?;
        }
        let mut fds = mc
            .status
            .as_ref()
            .map(|s| s.failure_domains.clone())
            .unwrap_or_default();
        fds.sort_by(|a, b| a.name.cmp(&b.name));
        let fds: Vec<Value> = fds
            .iter()
            .map(|f| json!({"name": f.name, "controlPlane": f.control_plane.unwrap_or(false), "attributes": f.attributes}))
            .collect();
        let mut want = json!({
            "initialization": {
                "infrastructureProvisioned": true,
                "controlPlaneInitialized": control_plane_initialized,
            },
            "phase": "Provisioned",
        });
        // CAPI's schema wants at least one item when the list is there.
        if !fds.is_empty() {
            want["failureDomains"] = json!(fds);
        }
        ctx.write_status(&api, cluster.as_ref(), want).await?;
    } else {
        ctx.write_status(&api, cluster.as_ref(), json!({"phase": "Provisioning"}))
            .await?;
    }
    Ok(Action::requeue(Duration::from_secs(60)))
}

/// The KubeadmControlPlane a Cluster names in `spec.controlPlaneRef`, if any.
async fn control_plane_of(ctx: &Ctx, ns: &str, cluster: &str) -> Result<Option<String>, Error> {
    let clusters = Api::<DynamicObject>::namespaced_with(
        ctx.client.clone(),
        ns,
        &ApiResource::erase::<Cluster>(&()),
    );
    Ok(clusters.get_opt(cluster).await?.and_then(|c| {
        let r = c.data.pointer("/spec/controlPlaneRef")?;
        (r["apiGroup"] == CONTROL_PLANE_GROUP && r["kind"] == "KubeadmControlPlane")
            .then(|| r["name"].as_str().map(String::from))
            .flatten()
    }))
}

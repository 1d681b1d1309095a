//! Flintlock's instance-data step: put the uid as `instance_id` into the cloud-init `meta-data`.

use std::collections::BTreeMap;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

const META_DATA: &str = "meta-data";
const INSTANCE_ID: &str = "instance_id";

/// Decodes `metadata["meta-data"]` (base64 of a YAML map of strings), sets `instance_id` to `uid`
/// unless it is already set, and writes it back with sorted keys. The key is added even when the
/// client sent no `meta-data`. Errors carry flintlock's texts (after `adding instance data: `).
pub(crate) fn inject_instance_id(
    metadata: &mut BTreeMap<String, String>,
    uid: &str,
) -> Result<(), String> {
    let mut instance: BTreeMap<String, String> = BTreeMap::new();
    if let Some(existing) = metadata.get(META_DATA).filter(|value| !value.is_empty()) {
        let decoded = STANDARD.decode(existing).map_err(|err| {
            format!(
                "decoding existing instance metadata: {}",
                go_base64_error(&err)
            )
        })?;
        let text = String::from_utf8_lossy(&decoded);
        if !text.trim().is_empty() {
            instance = serde_saphyr::from_str(&text).map_err(|err| {
                format!(
                    "unmarshalling exists instance metadata: {}",
                    first_line(&err.to_string())
                )
            })?;
        }
    }
    if instance.get(INSTANCE_ID).is_some_and(|id| !id.is_empty()) {
        return Ok(());
    }
    instance.insert(INSTANCE_ID.to_owned(), uid.to_owned());
    let yaml = serde_saphyr::to_string(&instance)
        .map_err(|err| format!("marshalling new instance metadata: {err}"))?;
    metadata.insert(META_DATA.to_owned(), STANDARD.encode(yaml));
    Ok(())
}

/// Go's `base64.CorruptInputError` text.
fn go_base64_error(err: &base64::DecodeError) -> String {
    let offset = match err {
        base64::DecodeError::InvalidByte(offset, _)
        | base64::DecodeError::InvalidLastSymbol(offset, _) => *offset,
        base64::DecodeError::InvalidLength(length) => *length,
        base64::DecodeError::InvalidPadding => 0,
    };
    format!("illegal base64 data at input byte {offset}")
}

fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta_data(metadata: &BTreeMap<String, String>) -> BTreeMap<String, String> {
        let yaml = STANDARD.decode(&metadata[META_DATA]).unwrap();
        serde_saphyr::from_str(std::str::from_utf8(&yaml).unwrap()).unwrap()
    }

    #[test]
    fn adds_instance_id_to_existing_meta_data() {
        let sent = "local_hostname: m1\nplatform: liquid_metal\nvm_host: 127.0.0.1:9090\n";
        let mut metadata = BTreeMap::from([(META_DATA.to_owned(), STANDARD.encode(sent))]);
        inject_instance_id(&mut metadata, "01KE75BHT9H6D7V5YG0KYGRXX2").unwrap();
        let instance = meta_data(&metadata);
        assert_eq!(instance["instance_id"], "01KE75BHT9H6D7V5YG0KYGRXX2");
        assert_eq!(instance["vm_host"], "127.0.0.1:9090");
        assert_eq!(instance.len(), 4);
        let yaml = String::from_utf8(STANDARD.decode(&metadata[META_DATA]).unwrap()).unwrap();
        assert!(yaml.starts_with("instance_id:"), "keys sorted: {yaml}");
    }

    #[test]
    fn adds_meta_data_when_absent_and_keeps_a_given_instance_id() {
        let mut metadata = BTreeMap::new();
        inject_instance_id(&mut metadata, "U1").unwrap();
        assert_eq!(meta_data(&metadata)["instance_id"], "U1");

        let mut metadata =
            BTreeMap::from([(META_DATA.to_owned(), STANDARD.encode("instance_id: mine\n"))]);
        inject_instance_id(&mut metadata, "U2").unwrap();
        assert_eq!(meta_data(&metadata)["instance_id"], "mine");
    }

    #[test]
    fn bad_meta_data_is_reported_like_flintlock() {
        let mut metadata = BTreeMap::from([(META_DATA.to_owned(), "!!!!".to_owned())]);
        let err = inject_instance_id(&mut metadata, "U").unwrap_err();
        assert_eq!(
            err,
            "decoding existing instance metadata: illegal base64 data at input byte 0"
        );

        let mut metadata = BTreeMap::from([(META_DATA.to_owned(), STANDARD.encode("- a\n- b\n"))]);
        let err = inject_instance_id(&mut metadata, "U").unwrap_err();
        assert!(
            err.starts_with("unmarshalling exists instance metadata: "),
            "{err}"
        );
    }
}

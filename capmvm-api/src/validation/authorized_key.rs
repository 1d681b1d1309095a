//! One OpenSSH `authorized_keys` entry as cloud-init writes it: `type base64 [comment]`, where the
//! base64 decodes to a key blob that starts with the same type string (a `u32` length, then the type).

use base64::Engine as _;

/// Key types OpenSSH accepts in `authorized_keys`.
pub(super) const KEY_TYPES: [&str; 14] = [
    "ssh-ed25519",
    "ssh-rsa",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "sk-ssh-ed25519@openssh.com",
    "sk-ecdsa-sha2-nistp256@openssh.com",
    "ssh-dss",
    "ssh-ed25519-cert-v01@openssh.com",
    "ssh-rsa-cert-v01@openssh.com",
    "ecdsa-sha2-nistp256-cert-v01@openssh.com",
    "ecdsa-sha2-nistp384-cert-v01@openssh.com",
    "ecdsa-sha2-nistp521-cert-v01@openssh.com",
    "sk-ssh-ed25519-cert-v01@openssh.com",
];

/// Why `line` is not a public key in `authorized_keys` form, or `Ok`.
pub(super) fn check(line: &str) -> Result<(), String> {
    let mut fields = line.split_ascii_whitespace();
    let (Some(key_type), Some(data)) = (fields.next(), fields.next()) else {
        return Err("is not a public key: write \"<type> <base64> [comment]\"".into());
    };
    if !KEY_TYPES.contains(&key_type) {
        return Err(format!(
            "key type {key_type:?} is not one OpenSSH accepts ({}); paste the whole line of the .pub file",
            KEY_TYPES[..5].join(", ")
        ));
    }
    let Ok(blob) = base64::engine::general_purpose::STANDARD.decode(data) else {
        return Err(format!(
            "the key data after {key_type:?} is not base64; paste the whole line of the .pub file"
        ));
    };
    let named = blob
        .get(..4)
        .and_then(|len| <[u8; 4]>::try_from(len).ok())
        .map(|len| u32::from_be_bytes(len) as usize)
        .and_then(|len| blob.get(4..4 + len));
    if named != Some(key_type.as_bytes()) {
        return Err(format!(
            "the key data is not a {key_type} key (its blob names another type, or is cut short); paste the whole line of the .pub file"
        ));
    }
    Ok(())
}

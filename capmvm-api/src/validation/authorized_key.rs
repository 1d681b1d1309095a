//! One OpenSSH `authorized_keys` entry as sshd reads it (sshd(8), "AUTHORIZED_KEYS FILE FORMAT"):
//! `[options] type base64 [comment]`, where the base64 decodes to a key blob that starts with the
//! same type string (a `u32` length, then the type), and the options are a comma-separated list
//! with no unquoted whitespace (`no-pty,command="backup --all",from="10.0.0.0/8"`).

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

/// Options sshd accepts that take no value (names are case-insensitive, as sshd compares them).
const FLAG_OPTIONS: [&str; 16] = [
    "agent-forwarding",
    "cert-authority",
    "no-agent-forwarding",
    "no-port-forwarding",
    "no-pty",
    "no-user-rc",
    "no-x11-forwarding",
    "port-forwarding",
    "pty",
    "restrict",
    "user-rc",
    "x11-forwarding",
    "no-touch-required",
    "touch-required",
    "verify-required",
    "no-verify-required",
];

/// Options sshd accepts that take a quoted value.
const VALUE_OPTIONS: [&str; 8] = [
    "command",
    "environment",
    "expiry-time",
    "from",
    "permitlisten",
    "permitopen",
    "principals",
    "tunnel",
];

/// Why `line` is not a public key in `authorized_keys` form, or `Ok`.
pub(super) fn check(line: &str) -> Result<(), String> {
    let line = line.trim();
    let first = line.split_ascii_whitespace().next().unwrap_or_default();
    if KEY_TYPES.contains(&first) {
        return check_key(line);
    }
    // Not a key type: the options, if what follows them is a key.
    let (options, key) = split_options(line)?;
    let follows_key = key
        .split_ascii_whitespace()
        .next()
        .is_some_and(|t| KEY_TYPES.contains(&t));
    if !follows_key {
        // Read as a key whose type is wrong (the common mistake), or no key at all.
        return check_key(line);
    }
    check_options(options)?;
    check_key(key)
}

/// `line` split after its options: sshd ends them at the first whitespace outside double quotes
/// (a `\"` inside quotes is a quote, not the end).
fn split_options(line: &str) -> Result<(&str, &str), String> {
    let mut quoted = false;
    let mut chars = line.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        match c {
            '\\' if quoted && chars.peek().is_some_and(|&(_, n)| n == '"') => {
                chars.next();
            }
            '"' => quoted = !quoted,
            c if c.is_ascii_whitespace() && !quoted => {
                return Ok((&line[..i], line[i..].trim_start()));
            }
            _ => {}
        }
    }
    if quoted {
        return Err(
            "has an unterminated quote in its options: close each value with \" (write \\\" for a quote inside)"
                .into(),
        );
    }
    Ok((line, ""))
}

/// Each comma-separated option is one sshd knows: a flag, or `name="value"`.
fn check_options(options: &str) -> Result<(), String> {
    for option in split_outside_quotes(options) {
        let (name, value) = match option.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (option, None),
        };
        let lower = name.to_ascii_lowercase();
        let known_flag = FLAG_OPTIONS.contains(&lower.as_str());
        let takes_value = VALUE_OPTIONS.contains(&lower.as_str());
        match (known_flag, takes_value, value) {
            (true, _, None) => {}
            (true, _, Some(_)) => {
                return Err(format!("option {name:?} takes no value; write it alone"));
            }
            (_, true, Some(v)) if v.len() >= 2 && v.starts_with('"') && v.ends_with('"') => {}
            (_, true, _) => {
                return Err(format!(
                    "option {name:?} needs a quoted value, for example {lower}=\"...\""
                ));
            }
            (false, false, _) => {
                return Err(format!(
                    "option {name:?} is not one sshd accepts (for example no-pty, restrict, from=\"...\", command=\"...\"); sshd would ignore this key"
                ));
            }
        }
    }
    Ok(())
}

/// `options` split at the commas outside double quotes (a `\"` inside quotes is a quote).
fn split_outside_quotes(options: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut quoted = false;
    let mut start = 0;
    let mut chars = options.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        match c {
            '\\' if quoted && chars.peek().is_some_and(|&(_, n)| n == '"') => {
                chars.next();
            }
            '"' => quoted = !quoted,
            ',' if !quoted => {
                parts.push(&options[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&options[start..]);
    parts
}

/// `type base64 [comment]`, the blob naming the type.
fn check_key(line: &str) -> Result<(), String> {
    let mut fields = line.split_ascii_whitespace();
    let (Some(key_type), Some(data)) = (fields.next(), fields.next()) else {
        return Err("is not a public key: write \"[options] <type> <base64> [comment]\"".into());
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

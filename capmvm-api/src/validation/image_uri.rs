//! flintlock's `imageURI` check: containerd's `reference.Parse`, which reads an image reference as the
//! authority and path of the URL `dummy://<reference>` (Go's `net/url` rules) and requires a host.
//!
//! So the first component must be a registry host: `ubuntu:22.04` reads as host `ubuntu` with port
//! `22.04` and is refused; flintlock never assumes `docker.io`.

/// Why flintlock refuses `reference`, or `Ok` if it accepts it.
pub(super) fn check(reference: &str) -> Result<(), String> {
    if reference.bytes().any(|b| b < 0x20 || b == 0x7f) {
        return Err("it holds a control character".into());
    }
    let (rest, fragment) = match reference.split_once('#') {
        Some((rest, fragment)) => (rest, Some(fragment)),
        None => (reference, None),
    };
    if let Some(fragment) = fragment {
        percent_escapes(fragment)?;
    }
    let rest = rest.split_once('?').map_or(rest, |(before, _)| before);
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let host = match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            if !userinfo.bytes().all(is_userinfo_byte) {
                return Err(format!(
                    "{userinfo:?} before '@' is not URL user information"
                ));
            }
            host
        }
        None => authority,
    };
    self::host(host)?;
    percent_escapes(path)?;
    if host.is_empty() {
        return Err("it has no registry host".into());
    }
    Ok(())
}

fn host(host: &str) -> Result<(), String> {
    let port = if host.starts_with('[') {
        let Some(end) = host.rfind(']') else {
            return Err(format!("{host:?} misses the ']' of its IPv6 address"));
        };
        &host[end + 1..]
    } else {
        host.rfind(':').map_or("", |i| &host[i..])
    };
    if !(port.is_empty()
        || (port.starts_with(':') && port[1..].bytes().all(|b| b.is_ascii_digit())))
    {
        return Err(format!(
            "{:?} reads as registry host {:?} with port {:?}, which is not a number",
            host,
            &host[..host.len() - port.len()],
            &port[1..]
        ));
    }
    let bytes = host.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let escape = host.get(i..i + 3).unwrap_or(&host[i..]);
                let valid = escape.len() == 3 && escape[1..].bytes().all(|b| b.is_ascii_hexdigit());
                // In a host, %-encoding is only for non-ASCII bytes (and %25 in IPv6 zones).
                if !valid || (escape[1..2] < *"8" && escape != "%25") {
                    return Err(format!("{escape:?} is not allowed in the registry host"));
                }
                i += 3;
            }
            b if b < 0x80 && !is_host_byte(b) => {
                return Err(format!(
                    "{:?} is not allowed in the registry host {host:?}",
                    char::from(b)
                ));
            }
            _ => i += 1,
        }
    }
    Ok(())
}

/// Every `%` starts a valid escape (`%` and two hex digits).
fn percent_escapes(s: &str) -> Result<(), String> {
    let bytes = s.as_bytes();
    for (i, b) in bytes.iter().enumerate() {
        if *b == b'%'
            && !(bytes.get(i + 1).is_some_and(u8::is_ascii_hexdigit)
                && bytes.get(i + 2).is_some_and(u8::is_ascii_hexdigit))
        {
            return Err(format!("'%' at byte {i} does not start an escape"));
        }
    }
    Ok(())
}

fn is_host_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-_.~!$&'()*+,;=:[]<>\"".contains(&b)
}

fn is_userinfo_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-._:~!$&'()*+,;=%@".contains(&b)
}

#[cfg(test)]
mod tests {
    use super::check;

    #[test]
    fn containerd_reference_parse_cases() {
        for ok in [
            "ghcr.io/liquidmetal-dev/flintlock-kernel:5.10.77",
            "docker.io/library/ubuntu:22.04",
            "localhost:5000/img:tag",
            "ubuntu",
            "registry/img",
            "[fd00::1]:5000/img@sha256:0123456789abcdef",
        ] {
            assert_eq!(check(ok), Ok(()), "{ok}");
        }
        for bad in [
            "ubuntu:22.04",
            "ubuntu:latest",
            "img@sha256:abcdef",
            "",
            "/img",
            "a b/img",
            "[fd00::1/img",
            "host/%zz",
            "ho%41st/img",
        ] {
            assert!(check(bad).is_err(), "{bad}");
        }
    }
}

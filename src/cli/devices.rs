//! The device options of `lwpvmm run`: `--disk PATH[,ro]`,
//! `--net tap=NAME[,mac=MAC]` and `--entropy[=BYTES_PER_S]`, parsed into
//! the VMM's device configurations with messages that say what to write
//! instead.

use std::path::PathBuf;

use crate::vmm::config::{BucketConfig, DiskConfig, EntropyConfig, NetConfig, RateLimit};

/// `PATH[,ro]`. A word after the last comma that is not `ro` is an option
/// lwpvmm does not have (`img,rw`), refused as that rather than taken for
/// a file name that does not exist; a file whose name has such a comma in
/// it still works, because an existing file is taken whole.
pub fn parse_disk(text: &str) -> Result<DiskConfig, String> {
    let (path, read_only) = match text.rsplit_once(',') {
        Some((path, "ro")) => (path, true),
        Some((_, option)) if is_option_word(option) && !std::path::Path::new(text).exists() => {
            return Err(format!(
                "`{option}` is not a --disk option: the only one is `,ro` (read-only); without it the disk is read-write"
            ));
        }
        _ => (text, false),
    };
    if path.is_empty() {
        return Err("expected PATH or PATH,ro (a raw disk image)".into());
    }
    Ok(DiskConfig {
        path: PathBuf::from(path),
        read_only,
    })
}

/// Whether `word` looks like an option (`rw`, `cache=none`) rather than
/// the end of a file name (`v2.img`, `a/b`).
fn is_option_word(word: &str) -> bool {
    !word.is_empty()
        && word
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'=' || b == b'_' || b == b'-')
}

/// `tap=NAME[,mac=MAC]`.
pub fn parse_net(text: &str) -> Result<NetConfig, String> {
    let mut tap = None;
    let mut mac = None;
    for part in text.split(',') {
        match part.split_once('=') {
            Some(("tap", name)) if !name.is_empty() && name.len() < 16 => {
                tap = Some(name.to_owned())
            }
            Some(("tap", _)) => return Err("a tap's name is 1 to 15 characters".into()),
            Some(("mac", m)) => mac = Some(parse_mac(m)?),
            _ => {
                return Err(format!(
                    "`{part}`: expected tap=NAME[,mac=MAC], e.g. tap=tap0,mac=02:00:00:00:00:01"
                ));
            }
        }
    }
    let tap = tap.ok_or("expected tap=NAME[,mac=MAC]: the tap is missing")?;
    Ok(NetConfig { id: None, tap, mac })
}

/// Six hexadecimal bytes separated by colons; not a multicast address.
fn parse_mac(text: &str) -> Result<[u8; 6], String> {
    let bad = || format!("`{text}` is not a MAC address such as 02:00:00:00:00:01");
    let mut mac = [0u8; 6];
    let mut parts = text.split(':');
    for byte in &mut mac {
        let part = parts.next().filter(|p| p.len() == 2).ok_or_else(bad)?;
        *byte = u8::from_str_radix(part, 16).map_err(|_| bad())?;
    }
    if parts.next().is_some() {
        return Err(bad());
    }
    if mac[0] & 1 != 0 {
        return Err(format!(
            "`{text}` is a multicast address: a NIC needs a unicast one"
        ));
    }
    Ok(mac)
}

/// `--entropy[=BYTES_PER_S]`: the entropy device, limited to that many
/// bytes a second unless 0.
pub fn entropy(bytes_per_s: u64) -> EntropyConfig {
    EntropyConfig {
        rate_limit: (bytes_per_s > 0).then_some(RateLimit {
            bandwidth: Some(BucketConfig {
                size: bytes_per_s,
                one_time_burst: 0,
                refill_time: 1000,
            }),
            ops: None,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disks() {
        // (option, path, read-only) or an error
        let table: [(&str, Option<(&str, bool)>); 8] = [
            ("root.ext4", Some(("root.ext4", false))),
            ("/images/data.img,ro", Some(("/images/data.img", true))),
            (",ro", None),
            ("", None),
            // Options lwpvmm does not have, not file names.
            ("img,rw", None),
            ("img,cache=none", None),
            // A comma inside a file name.
            ("disk,v2.img", Some(("disk,v2.img", false))),
            ("/a,b/disk", Some(("/a,b/disk", false))),
        ];
        for (text, want) in table {
            let got = parse_disk(text).ok();
            let got = got
                .as_ref()
                .map(|d| (d.path.to_str().unwrap(), d.read_only));
            assert_eq!(got, want, "{text}");
        }
    }

    #[test]
    fn nets() {
        // (option, tap, mac) or an error
        type Parsed = Option<(&'static str, Option<[u8; 6]>)>;
        let table: [(&str, Parsed); 8] = [
            ("tap=tap0", Some(("tap0", None))),
            (
                "tap=t1,mac=02:AB:00:00:00:0f",
                Some(("t1", Some([2, 0xab, 0, 0, 0, 0xf]))),
            ),
            ("tap=t1,mac=03:00:00:00:00:00", None),
            ("tap=t1,mac=02:00:00:00:00", None),
            ("tap=t1,mac=02:00:00:00:00:00:00", None),
            ("mac=02:00:00:00:00:01", None),
            ("tap=a-very-long-tap-name", None),
            ("tap0", None),
        ];
        for (text, want) in table {
            let got = parse_net(text).ok().map(|n| (n.tap, n.mac));
            let want = want.map(|(t, m)| (t.to_owned(), m));
            assert_eq!(got, want, "{text}");
        }
    }
}

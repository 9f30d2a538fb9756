use pdgate_mm::{content_hash, expand_placeholders, hash_hex, MmError, PlaceholderRange};

const IMAGE: u32 = 32000;

#[test]
fn each_placeholder_expands_to_its_images_count() {
    let ids = [1, 10, IMAGE, 11, IMAGE, 12];
    let (expanded, ranges) = expand_placeholders(&ids, IMAGE, &[4, 9]).unwrap();
    assert_eq!(expanded.len(), 4 + 4 + 9);
    assert_eq!(
        ranges,
        [
            PlaceholderRange {
                offset: 2,
                length: 4
            },
            PlaceholderRange {
                offset: 7,
                length: 9
            },
        ]
    );
    assert_eq!(&expanded[..2], &[1, 10]);
    assert!(expanded[2..6].iter().all(|&t| t == IMAGE));
    assert_eq!(expanded[6], 11);
    assert!(expanded[7..16].iter().all(|&t| t == IMAGE));
    assert_eq!(expanded[16], 12);
}

#[test]
fn a_prompt_without_images_is_unchanged() {
    let (expanded, ranges) = expand_placeholders(&[1, 2, 3], IMAGE, &[]).unwrap();
    assert_eq!(expanded, [1, 2, 3]);
    assert!(ranges.is_empty());
}

#[test]
fn more_images_than_placeholders_is_an_error_that_says_so() {
    let err = expand_placeholders(&[1, IMAGE, 2], IMAGE, &[4, 9]).unwrap_err();
    assert!(matches!(err, MmError::Placeholders(_)));
    let text = err.to_string();
    assert!(
        text.contains("1 image placeholder") && text.contains("2 image(s)"),
        "{text}"
    );
}

#[test]
fn fewer_images_than_placeholders_is_an_error() {
    assert!(expand_placeholders(&[IMAGE, IMAGE], IMAGE, &[4]).is_err());
}

#[test]
fn content_hash_is_blake3_of_the_bytes_as_received() {
    assert_eq!(
        hash_hex(&content_hash(b"abc")),
        "6437b3ac38465133ffb63b75273a8db548c558465d79db03fd359c6cd5bd9d85"
    );
}

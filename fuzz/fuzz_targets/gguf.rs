//! GGUF parsing and validation of arbitrary bytes: the header reader, the tensor table checks,
//! the model configuration, and the tokenizer built from the metadata. Nothing may panic,
//! hang or allocate more than the input justifies.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(f) = kiln::gguf::GgufFile::from_bytes("fuzz.gguf", data.to_vec()) else {
        return;
    };
    for t in &f.tensors {
        let d = f.tensor_data(t);
        assert_eq!(d.len() as u64, t.bytes);
        let _ = (t.n_elements(), t.type_name());
    }
    if let Ok(cfg) = kiln::model::ModelConfig::from_gguf(&f) {
        let _ = cfg.validate_tensors(&f);
    }
    if let Ok(tok) = kiln::tokenizer::Tokenizer::from_gguf(&f) {
        if let Ok(ids) = tok.encode("Hello world", true) {
            let _ = tok.decode(&ids);
        }
    }
});

//! Tensors on the wire: their element types, te's tensor body (dtype and shape beside exactly
//! the tensor's bytes), and the rule by which Mooncake's receiver takes a payload for a tensor.
//!
//! Mooncake's engine sends a tensor's raw bytes only. Its receiver routes every payload by one
//! rule ([`mooncake_header`]): at least [`MOONCAKE_HEADER`] bytes whose first `u32` is a dtype
//! id 1–9 and second an `ndim` of at most 4 are a tensor, its shape the positive `i64`s that
//! follow, its data the whole payload, header included. te applies the same rule to what
//! Mooncake peers send, so a program sees what a Mooncake receiver would show it.

/// Bytes of the header Mooncake's receiver looks for: dtype, ndim, four dimensions.
pub const MOONCAKE_HEADER: usize = 4 + 4 + 4 * 8;
/// The most dimensions a te tensor has.
pub const MAX_DIMS: usize = 8;

/// An element type. Mooncake's nine ids first (its receiver's numbering), then te's own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dtype {
    /// IEEE half.
    Float16,
    /// IEEE single.
    Float32,
    /// IEEE double.
    Float64,
    /// Signed 8-bit.
    Int8,
    /// Signed 16-bit.
    Int16,
    /// Signed 32-bit.
    Int32,
    /// Signed 64-bit.
    Int64,
    /// Unsigned 8-bit.
    UInt8,
    /// One byte, 0 or 1.
    Bool,
    /// Brain float (te's).
    BFloat16,
    /// Unsigned 16-bit (te's).
    UInt16,
    /// Unsigned 32-bit (te's).
    UInt32,
    /// Unsigned 64-bit (te's).
    UInt64,
}

impl Dtype {
    /// Every dtype, in id order.
    pub const ALL: [Dtype; 13] = [
        Dtype::Float16,
        Dtype::Float32,
        Dtype::Float64,
        Dtype::Int8,
        Dtype::Int16,
        Dtype::Int32,
        Dtype::Int64,
        Dtype::UInt8,
        Dtype::Bool,
        Dtype::BFloat16,
        Dtype::UInt16,
        Dtype::UInt32,
        Dtype::UInt64,
    ];

    /// Its id on the wire (1–9 are Mooncake's).
    pub fn id(self) -> u32 {
        Dtype::ALL.iter().position(|d| *d == self).unwrap_or(0) as u32 + 1
    }

    /// The dtype with `id`.
    pub fn from_id(id: u32) -> Option<Dtype> {
        let i = usize::try_from(id).ok()?.checked_sub(1)?;
        Dtype::ALL.get(i).copied()
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::Int8 | Dtype::UInt8 | Dtype::Bool => 1,
            Dtype::Float16 | Dtype::BFloat16 | Dtype::Int16 | Dtype::UInt16 => 2,
            Dtype::Float32 | Dtype::Int32 | Dtype::UInt32 => 4,
            Dtype::Float64 | Dtype::Int64 | Dtype::UInt64 => 8,
        }
    }

    /// Its name, as numpy and Mooncake's receiver spell it.
    pub fn name(self) -> &'static str {
        match self {
            Dtype::Float16 => "float16",
            Dtype::Float32 => "float32",
            Dtype::Float64 => "float64",
            Dtype::Int8 => "int8",
            Dtype::Int16 => "int16",
            Dtype::Int32 => "int32",
            Dtype::Int64 => "int64",
            Dtype::UInt8 => "uint8",
            Dtype::Bool => "bool",
            Dtype::BFloat16 => "bfloat16",
            Dtype::UInt16 => "uint16",
            Dtype::UInt32 => "uint32",
            Dtype::UInt64 => "uint64",
        }
    }

    /// The dtype named `name` (`float32`, `torch.float32`, `numpy.float32`…).
    pub fn from_name(name: &str) -> Option<Dtype> {
        let short = name.rsplit('.').next().unwrap_or(name);
        let short = match short {
            "half" => "float16",
            "float" => "float32",
            "double" => "float64",
            "short" => "int16",
            "int" => "int32",
            "long" => "int64",
            other => other,
        };
        Dtype::ALL.into_iter().find(|d| d.name() == short)
    }
}

/// A tensor's dtype and shape: what te's tensor call carries beside its bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorMeta {
    /// Element type.
    pub dtype: Dtype,
    /// Dimensions (none for a scalar).
    pub shape: Vec<u64>,
}

impl TensorMeta {
    /// The byte length its dtype and shape make, or `None` where that overflows.
    pub fn byte_len(&self) -> Option<u64> {
        self.shape
            .iter()
            .try_fold(self.dtype.size() as u64, |n, d| n.checked_mul(*d))
    }

    /// Checks that `len` bytes are exactly this tensor.
    ///
    /// # Errors
    /// What disagrees.
    pub fn check_len(&self, len: u64) -> std::result::Result<(), String> {
        if self.shape.len() > MAX_DIMS {
            return Err(format!(
                "{} dimensions, at most {MAX_DIMS}",
                self.shape.len()
            ));
        }
        match self.byte_len() {
            Some(n) if n == len => Ok(()),
            Some(n) => Err(format!(
                "{} {:?} is {n} bytes, not {len}",
                self.dtype.name(),
                self.shape
            )),
            None => Err(format!("shape {:?} overflows", self.shape)),
        }
    }

    /// te's tensor body: dtype id (`u8`), ndim (`u8`), six zero bytes, then each dimension as
    /// a little-endian `u64`.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![
            self.dtype.id() as u8,
            self.shape.len() as u8,
            0,
            0,
            0,
            0,
            0,
            0,
        ];
        for d in &self.shape {
            b.extend_from_slice(&d.to_le_bytes());
        }
        b
    }

    /// Reads te's tensor body.
    ///
    /// # Errors
    /// What is wrong with it.
    pub fn decode(b: &[u8]) -> std::result::Result<Self, String> {
        let (head, dims) = b.split_at_checked(8).ok_or("a tensor body under 8 bytes")?;
        let dtype = Dtype::from_id(u32::from(head[0]))
            .ok_or_else(|| format!("unknown dtype id {}", head[0]))?;
        let ndim = usize::from(head[1]);
        if ndim > MAX_DIMS || head[2..].iter().any(|x| *x != 0) {
            return Err(format!(
                "ndim {ndim} (at most {MAX_DIMS}) or reserved bytes set"
            ));
        }
        if dims.len() != ndim * 8 {
            return Err(format!("{ndim} dimensions in {} bytes", dims.len()));
        }
        let shape = dims
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
            .collect();
        Ok(TensorMeta { dtype, shape })
    }
}

/// How Mooncake's receiver sees a payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MooncakeView {
    /// Plain data: its data callback.
    Data,
    /// A tensor (its whole payload, header included): its tensor callback.
    Tensor(TensorMeta),
    /// A tensor header with a dimension of 2^48 or more: Mooncake's receiver drops it; te
    /// hands it on as data.
    Oversized,
}

/// Mooncake's receiver's rule for `payload`.
pub fn mooncake_header(payload: &[u8]) -> MooncakeView {
    let Some(head) = payload.get(..MOONCAKE_HEADER) else {
        return MooncakeView::Data;
    };
    let word = |i: usize| u32::from_le_bytes([head[i], head[i + 1], head[i + 2], head[i + 3]]);
    let (id, ndim) = (word(0), word(4));
    let dtype = match Dtype::from_id(id) {
        Some(d) if id <= 9 && ndim <= 4 => d,
        _ => return MooncakeView::Data,
    };
    let mut shape = Vec::new();
    for i in 0..ndim as usize {
        let at = 8 + i * 8;
        let d = i64::from_le_bytes(head[at..at + 8].try_into().unwrap_or_default());
        if d >= 1 << 48 {
            return MooncakeView::Oversized;
        }
        if d > 0 {
            shape.push(d as u64);
        }
    }
    MooncakeView::Tensor(TensorMeta { dtype, shape })
}

/// The header Mooncake's receiver recognises, for a te tensor going to a Mooncake peer as a
/// tensor: `None` where the tensor has more than four dimensions or is not one of its dtypes.
pub fn mooncake_tensor_header(meta: &TensorMeta) -> Option<[u8; MOONCAKE_HEADER]> {
    let id = meta.dtype.id();
    if id > 9 || meta.shape.len() > 4 {
        return None;
    }
    let mut h = [0u8; MOONCAKE_HEADER];
    h[..4].copy_from_slice(&id.to_le_bytes());
    h[4..8].copy_from_slice(&(meta.shape.len() as u32).to_le_bytes());
    for (i, d) in meta.shape.iter().enumerate() {
        let d = i64::try_from(*d).ok()?;
        h[8 + i * 8..16 + i * 8].copy_from_slice(&d.to_le_bytes());
    }
    Some(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtypes_keep_mooncakes_ids_and_names() {
        let mooncake = [
            "float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool",
        ];
        for (i, name) in mooncake.iter().enumerate() {
            let d = Dtype::from_id(i as u32 + 1).unwrap();
            assert_eq!(d.name(), *name);
            assert_eq!(Dtype::from_name(&format!("torch.{name}")), Some(d));
        }
        assert_eq!(Dtype::from_name("torch.bfloat16"), Some(Dtype::BFloat16));
        assert_eq!(Dtype::from_name("torch.half"), Some(Dtype::Float16));
        assert_eq!(Dtype::from_name("complex64"), None);
        assert_eq!(Dtype::from_id(0), None);
        assert_eq!(Dtype::from_id(14), None);
    }

    #[test]
    fn te_tensor_bodies_round_trip_and_check_their_length() {
        for shape in [vec![], vec![3], vec![2, 3], vec![1, 2, 3, 4], vec![0, 5]] {
            let m = TensorMeta {
                dtype: Dtype::BFloat16,
                shape,
            };
            assert_eq!(TensorMeta::decode(&m.encode()), Ok(m.clone()));
            let len = m.byte_len().unwrap();
            assert!(m.check_len(len).is_ok());
            assert!(m.check_len(len + 1).is_err());
        }
        let huge = TensorMeta {
            dtype: Dtype::Float64,
            shape: vec![u64::MAX, 2],
        };
        assert!(huge.check_len(0).unwrap_err().contains("overflows"));
    }

    #[test]
    fn hostile_tensor_bodies_are_refused() {
        let ok = TensorMeta {
            dtype: Dtype::Int8,
            shape: vec![4],
        }
        .encode();
        let mut bad_dtype = ok.clone();
        bad_dtype[0] = 200;
        let mut bad_ndim = ok.clone();
        bad_ndim[1] = 9;
        let mut reserved = ok.clone();
        reserved[5] = 1;
        for b in [
            &bad_dtype,
            &bad_ndim,
            &reserved,
            &ok[..12].to_vec(),
            &vec![],
        ] {
            assert!(TensorMeta::decode(b).is_err(), "{b:?}");
        }
    }

    #[test]
    fn mooncakes_rule_routes_as_its_receiver_does() {
        let meta = TensorMeta {
            dtype: Dtype::Float32,
            shape: vec![2, 3],
        };
        let mut payload = mooncake_tensor_header(&meta).unwrap().to_vec();
        payload.extend_from_slice(&[0; 24]);
        assert_eq!(mooncake_header(&payload), MooncakeView::Tensor(meta));
        assert_eq!(mooncake_header(&payload[..39]), MooncakeView::Data);
        let mut not = payload.clone();
        not[0] = 10;
        assert_eq!(mooncake_header(&not), MooncakeView::Data);
        let mut five = payload.clone();
        five[4] = 5;
        assert_eq!(mooncake_header(&five), MooncakeView::Data);
        let mut big = payload.clone();
        big[8..16].copy_from_slice(&(1i64 << 48).to_le_bytes());
        assert_eq!(mooncake_header(&big), MooncakeView::Oversized);
        let mut negative = payload;
        negative[8..16].copy_from_slice(&(-1i64).to_le_bytes());
        match mooncake_header(&negative) {
            MooncakeView::Tensor(m) => assert_eq!(m.shape, vec![3]),
            other => panic!("{other:?}"),
        }
    }
}

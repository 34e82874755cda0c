//! Element types of typed views: parsed from what Python users pass (`"float32"`, `"<f4"`,
//! `numpy.float32`, `numpy.dtype("float32")`, `torch.float32`), and spelled as NumPy's
//! `__array_interface__` / `__cuda_array_interface__` typestr and as DLPack's type code.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyString;

/// DLPack's type codes (dlpack.h `DLDataTypeCode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Kind {
    Int = 0,
    UInt = 1,
    Float = 2,
    BFloat = 4,
    Complex = 5,
    Bool = 6,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DType {
    pub(crate) kind: Kind,
    pub(crate) bits: u8,
    pub(crate) name: &'static str,
}

const TYPES: [DType; 15] = [
    DType::new(Kind::Bool, 8, "bool"),
    DType::new(Kind::Int, 8, "int8"),
    DType::new(Kind::Int, 16, "int16"),
    DType::new(Kind::Int, 32, "int32"),
    DType::new(Kind::Int, 64, "int64"),
    DType::new(Kind::UInt, 8, "uint8"),
    DType::new(Kind::UInt, 16, "uint16"),
    DType::new(Kind::UInt, 32, "uint32"),
    DType::new(Kind::UInt, 64, "uint64"),
    DType::new(Kind::Float, 16, "float16"),
    DType::new(Kind::BFloat, 16, "bfloat16"),
    DType::new(Kind::Float, 32, "float32"),
    DType::new(Kind::Float, 64, "float64"),
    DType::new(Kind::Complex, 64, "complex64"),
    DType::new(Kind::Complex, 128, "complex128"),
];

pub(crate) const UINT8: DType = TYPES[5];

impl DType {
    const fn new(kind: Kind, bits: u8, name: &'static str) -> DType {
        DType { kind, bits, name }
    }

    pub(crate) fn itemsize(self) -> usize {
        self.bits as usize / 8
    }

    /// NumPy's typestr (`<f4`, `|u1`, `|b1`), on this little-endian machine. `None` for
    /// bfloat16, which NumPy's interfaces cannot name.
    pub(crate) fn typestr(self) -> Option<String> {
        let letter = match self.kind {
            Kind::Bool => 'b',
            Kind::Int => 'i',
            Kind::UInt => 'u',
            Kind::Float => 'f',
            Kind::Complex => 'c',
            Kind::BFloat => return None,
        };
        let order = if self.bits == 8 { '|' } else { '<' };
        Some(format!("{order}{letter}{}", self.itemsize()))
    }

    /// Parses a type name, a NumPy typestr (`<f4`, `u1`), or the object's name (`numpy.float32`,
    /// `numpy.dtype(...)`, `torch.float32`, Python's `bool`, `int` and `float`).
    pub(crate) fn parse(obj: &Bound<'_, PyAny>) -> PyResult<DType> {
        if attr_str(obj, "byteorder").as_deref() == Some(">") {
            return Err(PyValueError::new_err(format!(
                "big-endian element type {}: the GPU and this CPU are little-endian",
                obj.str()?
            )));
        }
        let text = if let Ok(s) = obj.cast::<PyString>() {
            s.to_cow()?.into_owned()
        } else if let Some(name) = attr_str(obj, "name") {
            name // numpy.dtype
        } else if let Some(name) = attr_str(obj, "__name__") {
            name // numpy.float32, bool, int, float
        } else {
            obj.str()?.to_cow()?.into_owned() // torch.float32
        };
        Self::from_name(&text).ok_or_else(|| {
            PyValueError::new_err(format!(
                "unknown element type {text:?}: use one of {} (or a NumPy/PyTorch dtype of them)",
                Self::all().map(|t| t.name).collect::<Vec<_>>().join(", ")
            ))
        })
    }

    fn all() -> impl Iterator<Item = DType> {
        TYPES.into_iter()
    }

    pub(crate) fn from_name(text: &str) -> Option<DType> {
        let t = text.trim();
        let t = t.strip_prefix("torch.").unwrap_or(t);
        let by_alias = match t {
            "bool_" => Some("bool"),
            "int" => Some("int64"),
            "float" | "double" => Some("float64"),
            "half" => Some("float16"),
            "complex" | "cdouble" => Some("complex128"),
            "cfloat" => Some("complex64"),
            _ => None,
        };
        let t = by_alias.unwrap_or(t);
        if let Some(d) = Self::all().find(|d| d.name == t) {
            return Some(d);
        }
        // A typestr: byte order (little or native: this is x86-64), kind letter, item size.
        let bare = t.strip_prefix(['<', '|', '=']).unwrap_or(t);
        Self::all().find(|d| d.typestr().is_some_and(|s| &s[1..] == bare))
    }
}

fn attr_str(obj: &Bound<'_, PyAny>, name: &str) -> Option<String> {
    let v = obj.getattr(name).ok()?;
    let s = v.cast::<PyString>().ok()?;
    s.to_cow().ok().map(|c| c.into_owned())
}

/// The shape of a view: `None` (as many elements as fit), an int, or a sequence of ints.
pub(crate) fn parse_shape(
    shape: Option<&Bound<'_, PyAny>>,
    available: usize,
    dtype: DType,
) -> PyResult<Vec<usize>> {
    let Some(shape) = shape.filter(|s| !s.is_none()) else {
        if !available.is_multiple_of(dtype.itemsize()) {
            return Err(PyValueError::new_err(format!(
                "{available} bytes are not a whole number of {} elements ({} bytes each); \
                 give a shape",
                dtype.name,
                dtype.itemsize()
            )));
        }
        return Ok(vec![available / dtype.itemsize()]);
    };
    crate::args::shape(shape)
}

/// Bytes a C-contiguous array of `shape` and `dtype` takes; `None` on overflow.
pub(crate) fn nbytes(shape: &[usize], dtype: DType) -> Option<usize> {
    shape
        .iter()
        .try_fold(dtype.itemsize(), |acc, &d| acc.checked_mul(d))
}
